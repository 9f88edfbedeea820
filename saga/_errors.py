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
    ├── InvalidToken           a resume token is malformed, forged or tampered with
    ├── ScheduleNotFound       no schedule has this id (in this context)
    └── ScheduleExists         a schedule with this id exists already

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


class ScheduleNotFound(SagaError):
    """No schedule has this id in this context."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"no schedule with id {schedule_id!r}")
        self.schedule_id = schedule_id


class ScheduleExists(SagaError):
    """A schedule with this id exists already (pass ``replace=True`` to replace it)."""


__all__ = [
    "ConcurrentUpdate",
    "DefinitionError",
    "IllegalTransition",
    "InvalidInput",
    "PermanentError",
    "SagaError",
    "SagaExists",
    "SagaNotFound",
    "ScheduleExists",
    "ScheduleNotFound",
    "TransientError",
    "UnknownDefinition",
]
