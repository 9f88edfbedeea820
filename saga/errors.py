"""The saga engine's errors.

::

    SagaError
    ├── DefinitionError        a saga is declared wrongly (raised at import time)
    ├── InvalidInput           start data or an operator's output does not match its type
    ├── IllegalTransition      the state machine was asked for a transition it does not allow
    ├── SagaNotFound           no saga has this id
    ├── SagaExists             the id is taken by a different saga definition
    │   └── StartConflict      ... or by a saga of this definition started with other data
    ├── ConcurrentUpdate       the saga moved on while an operation was being decided
    ├── UnknownDefinition      no definition with this name and version is registered here
    │   └── CodeRequired       the operation needs the definition's code, and only its shape is known
    ├── ActionRefused          an operator action would not apply, or lost a race (says why)
    ├── InvalidToken           a resume token is malformed, forged, expired or not for this saga
    ├── WaitEnded              the wait a resume token names has ended: nothing was sent
    ├── ScheduleNotFound       no schedule has this id (in this context)
    ├── ScheduleExists         a schedule with this id exists already
    └── VersionError           a definition-version operation is refused (saga/versions/registry.py)
        ├── IncompatibleChange a registered version's shape changed incompatibly
        ├── VersionDrained     new sagas may not start on a drained version
        ├── VersionInUse       a version with sagas in flight cannot be decommissioned
        └── MigrationRefused   a migration cannot move this instance (or any, and says why)

Participants signal step failures with :class:`bus.TransientError` (the step's retry
policy applies) and :class:`bus.PermanentError` (compensate); any other exception counts as
transient.
"""

from __future__ import annotations


class SagaError(Exception):
    """Base class of the saga engine's errors."""

    retryable: bool = False


class DefinitionError(SagaError):
    """A saga definition is wrong; ``saga`` and ``step`` say where, and so does the message.

    ``step`` is the step, branch or compensation that is wrong (empty when the whole saga
    is); ``saga`` is empty only for what belongs to no saga (a context, a participant, a
    name that cannot be a saga's).
    The message is ``<saga>.<step>: <reason>``, ``saga '<saga>': <reason>`` or the reason.
    """

    def __init__(self, reason: str, *, saga: str = "", step: str = "") -> None:
        if saga and step:
            message = f"{saga}.{step}: {reason}"
        else:
            message = f"saga {saga!r}: {reason}" if saga else reason
        super().__init__(message)
        self.reason = reason
        self.saga = saga
        self.step = step


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


class StartConflict(SagaExists):
    """A start with a saga id that exists, with other data: the new data was not stored.

    A start with an existing id is idempotent only when it asks for the same saga: equal
    data. ``saga_id`` is the id, ``definition`` what the existing saga runs (``name@version``).
    """

    def __init__(self, saga_id: str, definition: str) -> None:
        super().__init__(
            f"saga {saga_id!r} exists ({definition}) with other data; the new data was not stored "
            "(start it with another id, or cancel the existing saga first)"
        )
        self.saga_id = saga_id
        self.definition = definition


class ConcurrentUpdate(SagaError):
    """The saga changed while the operation was decided; re-read it and try again."""

    retryable = True


class UnknownDefinition(SagaError):
    """No definition with this name and version is registered with this worker or client."""


class WaitEnded(SagaError):
    """The wait a resume token names has ended: nothing was sent.

    It was resumed, timed out, or its saga ended or was cancelled; ``how`` says which, as
    the step's attempt records it.
    """

    def __init__(self, saga_id: str, step: str, n: int, how: str) -> None:
        super().__init__(
            f"wait {n} of step {step!r} in saga {saga_id!r} has ended ({how}): the signal was not sent "
            "(delivered already?)"
        )
        self.saga_id = saga_id
        self.step = step
        self.n = n
        self.how = how


class InvalidToken(SagaError):
    """A resume token is malformed, forged, tampered with, expired or for another saga.

    Nothing was delivered. ``saga`` is the saga id the token names, when it could be read.
    """

    def __init__(self, message: str, *, saga: str = "") -> None:
        super().__init__(message)
        self.saga = saga


class CodeRequired(UnknownDefinition):
    """The operation needs a definition's code (typed data, the decider); only its shape is known.

    An admin client reading definitions from Redis
    (:class:`~saga.versions.catalogue.Catalogue`) reads and acts without the code; starting,
    replaying, redriving and dry runs need the App defining ``definition`` (``name@version``).
    ``operation`` names what was asked.
    """

    def __init__(self, operation: str, definition: str) -> None:
        super().__init__(
            f"{operation} needs the code of {definition}: give the App that defines it "
            "(--app module:attribute, or REDSAGA_APP)"
        )
        self.operation = operation
        self.definition = definition


class VersionError(SagaError):
    """A definition-version operation was refused; ``saga`` and ``version`` name the version."""

    def __init__(self, message: str, *, saga: str = "", version: int = 0) -> None:
        super().__init__(message)
        self.saga = saga
        self.version = version


class IncompatibleChange(VersionError):
    """The code changed registered versions' shapes in ways their running instances cannot take.

    ``problems`` holds one line per breaking change (``name@version: what: make this
    version N+1``); the message lists them all.
    """

    def __init__(self, message: str, problems: list[str], *, saga: str = "", version: int = 0) -> None:
        super().__init__(message + "".join(f"\n  {p}" for p in problems), saga=saga, version=version)
        self.problems = problems


class VersionDrained(VersionError):
    """The definition version is drained: sagas already running end on it, no new one starts."""


class VersionInUse(VersionError):
    """The version still has sagas in flight (``in_flight`` of them), so it cannot be removed."""

    def __init__(self, message: str, *, saga: str, version: int, in_flight: int) -> None:
        super().__init__(message, saga=saga, version=version)
        self.in_flight = in_flight


class PartitionMismatch(SagaError):
    """A participant serves a context with another partition count than the context registered.

    Commands sent from the partitions it does not know about would never be handled.
    """


class MigrationRefused(VersionError):
    """A migration cannot move an instance (the message says why); the instance is untouched."""


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


class ScheduleNotFound(SagaError):
    """No schedule has this id in this context."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"no schedule with id {schedule_id!r}")
        self.schedule_id = schedule_id


class ScheduleExists(SagaError):
    """A schedule with this id exists already (pass ``replace=True`` to replace it)."""


__all__ = [
    "ActionRefused",
    "CodeRequired",
    "ConcurrentUpdate",
    "DefinitionError",
    "IllegalTransition",
    "IncompatibleChange",
    "InvalidInput",
    "MigrationRefused",
    "SagaError",
    "SagaExists",
    "SagaNotFound",
    "ScheduleExists",
    "ScheduleNotFound",
    "StartConflict",
    "UnknownDefinition",
    "VersionDrained",
    "VersionError",
    "VersionInUse",
]
