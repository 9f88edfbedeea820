"""The saga engine's errors.

::

    SagaError
    ├── DefinitionError        a saga is declared wrongly (raised at import time)
    ├── InvalidInput           start data or an operator's output does not match its type
    ├── IllegalTransition      the state machine was asked for a transition it does not allow
    ├── SagaNotFound           no saga has this id
    ├── SagaExists             the id is taken by a different saga definition
    ├── ConcurrentUpdate       the saga moved on while an operation was being decided
    ├── UnknownDefinition      no definition with this name and version is registered here
    └── ActionRefused          an operator action would not apply, or lost a race (says why)

Participants signal step failures with :class:`bus.TransientError` (the step's retry
policy applies) and :class:`bus.PermanentError` (compensate); any other exception counts as
transient.
"""

from __future__ import annotations

from bus import PermanentError, TransientError


class SagaError(Exception):
    """Base class of the saga engine's errors."""

    retryable: bool = False


class DefinitionError(SagaError):
    """A saga definition is wrong; the message names the saga and the step."""


class InvalidInput(SagaError):
    """Data given to the engine does not match the declared type; nothing was stored."""


class IllegalTransition(SagaError):
    """The state machine does not allow this transition (a bug, never applied silently)."""

    def __init__(self, what: str, source: str, target: str) -> None:
        super().__init__(f"illegal {what} transition {source} -> {target}")
        self.source = source
        self.target = target


class SagaNotFound(SagaError):
    """No saga has this id (in this context)."""

    def __init__(self, saga_id: str) -> None:
        super().__init__(f"no saga with id {saga_id!r}")
        self.saga_id = saga_id


class SagaExists(SagaError):
    """A saga with this id exists and belongs to another definition."""


class ConcurrentUpdate(SagaError):
    """The saga changed while the operation was decided; re-read it and try again."""

    retryable = True


class UnknownDefinition(SagaError):
    """No definition with this name and version is registered with this worker or client."""


class ActionRefused(SagaError):
    """An operator action (cancel, retry, force-complete, redrive) did not apply.

    Either the admin client saw that the decider would ignore it (nothing was sent,
    ``request_id`` is empty), or the orchestrator recorded it and ignored it because the saga
    had moved on (``request_id`` names the history entry). ``reason`` is the decider's.
    """

    def __init__(self, action: str, saga_id: str, reason: str, *, request_id: str = "") -> None:
        when = "was ignored" if request_id else "would be ignored; nothing was sent"
        super().__init__(f"{action} of saga {saga_id} {when}: {reason}")
        self.action = action
        self.saga_id = saga_id
        self.reason = reason
        self.request_id = request_id


__all__ = [
    "ActionRefused",
    "ConcurrentUpdate",
    "DefinitionError",
    "IllegalTransition",
    "InvalidInput",
    "PermanentError",
    "SagaError",
    "SagaExists",
    "SagaNotFound",
    "TransientError",
    "UnknownDefinition",
]
