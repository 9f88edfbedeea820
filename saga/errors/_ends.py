"""The errors of waiting for a saga's end (drawn in ``saga/errors/__init__.py``'s tree).

``SagaClient.result`` raises a :class:`SagaEnded` subclass when the saga ended without
completing, one per end state, and :class:`ResultTimeout` when it had not ended in time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from saga.errors._base import SagaError

if TYPE_CHECKING:  # the type of a field only
    from saga.core.model import SagaState


class SagaEnded(SagaError):
    """The saga ended without completing: ``status`` says how.

    ``saga_id`` is the saga and ``definition`` what it ran (``name@version``); ``step`` is the
    step whose failure ended it and ``reason`` why, as the saga's last note records them
    (empty when it has none); ``state`` is the saga's final state, for everything else.
    Catch a subclass to act on one end only.
    """

    status: ClassVar[str] = ""

    def __init__(self, state: SagaState) -> None:
        note = state.error or state.cancel
        self.saga_id = state.id
        self.definition = f"{state.name}@{state.version}"
        self.step = note.step if note else ""
        self.reason = note.reason if note else ""
        self.state = state
        where = f" at step {self.step!r}" if self.step else ""
        why = f": {self.reason}" if self.reason else ""
        super().__init__(f"saga {state.id!r} ({self.definition}) ended {self.status}{where}{why}")


class SagaFailed(SagaEnded):
    """A step failed for good and nothing needed undoing (status ``failed``)."""

    status = "failed"


class SagaCompensated(SagaEnded):
    """A step failed for good and every completed step was undone (status ``compensated``)."""

    status = "compensated"


class SagaCancelled(SagaEnded):
    """The saga was cancelled and its completed steps undone (status ``cancelled``)."""

    status = "cancelled"


class SagaDeadLettered(SagaEnded):
    """Retries ran out (a step's or a compensation's): an operator must act (``dead_lettered``).

    ``saga replay``, ``saga force-complete`` or ``saga cancel`` lead out of it; a
    ``result()`` called again then waits for the saga's new end.
    """

    status = "dead_lettered"


class ResultTimeout(SagaError, TimeoutError):
    """The saga had not ended when the wait's ``timeout_s`` ran out; it goes on running.

    ``saga_id`` is the saga and ``status`` the status it was last seen in.
    """

    def __init__(self, saga_id: str, status: str, timeout_s: float) -> None:
        super().__init__(f"saga {saga_id!r} has not ended after {timeout_s:g} s (it is {status})")
        self.saga_id = saga_id
        self.status = status
        self.timeout_s = timeout_s
