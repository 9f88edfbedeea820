"""The saga engine's errors.

::

    SagaError
    ├── DefinitionError        a saga is declared wrongly (raised at import time)
    ├── InvalidSchedule*       a schedule is declared wrongly (its id, time zone, dates)
    │   ├── CronError*         ... its cron expression is invalid (says which field)
    │   └── CalendarError*     ... it names a holiday calendar the holidays package lacks
    ├── TooManyItems*          a map step's items() returned more items than its limit
    ├── InvalidInput           start data or an operator's output does not match its type
    ├── IllegalTransition      the state machine was asked for a transition it does not allow
    ├── SagaNotFound           no saga has this id
    ├── SagaExists             the id is taken by a different saga definition
    │   └── StartConflict      ... or by a saga of this definition started with other data
    ├── StartPending           a start request was sent, but no orchestrator decided it in time
    ├── KeyBusy                a singleton's start found its key's slot taken: nothing started
    ├── ConcurrentUpdate       the saga moved on while an operation was being decided
    ├── UnknownDefinition      no definition with this name and version is registered here
    │   └── CodeRequired       the operation needs the definition's code, and only its shape is known
    ├── ActionRefused          an operator action would not apply, or lost a race (says why)
    ├── InvalidToken           a resume token is malformed, forged, expired or not for this saga
    ├── WaitEnded              the wait a resume token names has ended: nothing was sent
    ├── SagaEnded              a saga ``result()`` waited for ended without completing (``status``)
    │   ├── SagaFailed         ... a step failed for good and nothing needed undoing
    │   ├── SagaCompensated    ... a step failed for good and the completed steps were undone
    │   ├── SagaCancelled      ... it was cancelled and the completed steps were undone
    │   └── SagaDeadLettered   ... retries ran out: an operator must act
    ├── ResultTimeout‡         a saga had not ended when ``wait()``'s or ``result()``'s timeout ran out
    ├── ScheduleNotFound       no schedule has this id (in this context)
    ├── ScheduleExists         a schedule with this id exists already
    ├── PartitionMismatch      a participant serves a context with another partition count
    ├── PartitionOutOfRange*   a worker was told to serve a partition index no context has
    ├── ReplayMismatch†        replaying a history decided something else (saga.testing.replay)
    ├── TraceMismatch†         an exported trace does not replay (saga.testing.replay_trace)
    ├── RunnerError            saga.testing's runner cannot go on: a mistake in the test's set-up
    │   └── ChildError         ... a child saga's definition was not given to the runner
    ├── TaskError              a human-task action was refused (``task`` names the task)
    │   ├── TaskNotFound       no open task has this id
    │   ├── TaskAlreadyClaimed another person holds the task's claim (``holder``, ``until_ms``)
    │   ├── TaskClosed         the task was completed, withdrawn or failed already (``state``)
    │   ├── NotAuthorized      the person may not do this to the task (``by``, ``action``)
    │   └── InvalidAnswer      the answer does not match the task's form (nothing was written)
    └── VersionError           a definition-version operation is refused (saga/versions/registry.py)
        ├── IncompatibleChange a registered version's shape changed incompatibly
        ├── VersionDrained     new sagas may not start on a drained version
        ├── VersionInUse       a version with sagas in flight cannot be decommissioned
        └── MigrationRefused   a migration cannot move this instance (or any, and says why)

``*`` is also a :class:`ValueError` (what such a mistake was before, and what msgspec turns
into a ``ValidationError`` when it decodes a schedule); ``†`` is also an
:class:`AssertionError`, so a test that fails on one fails as an assertion does; ``‡`` is
also a :class:`TimeoutError`. Every error
carries what it is about as attributes (the saga, step, schedule, expression, ...), and its
message says what to do; code that needs to tell errors apart reads the class and the
attributes, never the message.

Participants signal step failures with :class:`bus.TransientError` (the step's retry
policy applies) and :class:`bus.PermanentError` (compensate); any other exception counts as
transient.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from saga.errors._base import SagaError
from saga.errors._ends import (
    ResultTimeout,
    SagaCancelled,
    SagaCompensated,
    SagaDeadLettered,
    SagaEnded,
    SagaFailed,
)
from saga.errors._tasks import (
    InvalidAnswer,
    NotAuthorized,
    TaskAlreadyClaimed,
    TaskClosed,
    TaskError,
    TaskNotFound,
)

if TYPE_CHECKING:  # the types of fields only: this module imports nothing of ours when it runs
    from saga.core.replay import Mismatch
    from saga.ops.trace import Trace


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
        self.reason, self.saga, self.step = reason, saga, step


class InvalidSchedule(SagaError, ValueError):
    """A schedule is declared wrongly; nothing was stored.

    ``reason`` says what is wrong; ``schedule_id`` is the schedule's id (empty when the
    mistake was found outside a schedule, as in a cron expression parsed on its own).
    """

    def __init__(self, reason: str, *, schedule_id: str = "") -> None:
        super().__init__(f"schedule {schedule_id!r}: {reason}" if schedule_id else reason)
        self.reason = reason
        self.schedule_id = schedule_id


class CronError(InvalidSchedule):
    """A cron expression is invalid; the message says which field and what it may hold.

    Attributes:
        expression: The expression as given.
        field: The field that is wrong (``minute`` … ``day of week``), or ``""`` when the
            expression as a whole is (wrong number of fields, a day that never comes).

    """

    def __init__(self, expression: str, problem: str, *, field: str = "") -> None:
        super().__init__(f"cron {expression!r}: {problem}")
        self.expression = expression
        self.field = field


class CalendarError(InvalidSchedule):
    """A holiday calendar name is not one the ``holidays`` package knows; the message says why.

    Attributes:
        calendar: The name as given.

    """

    def __init__(self, calendar: str, problem: str) -> None:
        super().__init__(f"holiday calendar {calendar!r}: {problem}")
        self.calendar = calendar


class TooManyItems(SagaError, ValueError):
    """A map step's ``items()`` returned ``count`` items, more than its ``limit``.

    The step fails (and the saga compensates) with this message as its reason; raise the
    map's ``limit`` or split the work if that many items are expected.
    """

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"{count} items, over the map's limit of {limit}")
        self.count = count
        self.limit = limit


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


class StartPending(SagaError):
    """A start request is stored, but no orchestrator decided it within ``waited_s`` (safe to repeat)."""

    retryable = True

    def __init__(self, saga_id: str, request_id: str, waited_s: float) -> None:
        super().__init__(
            f"start of saga {saga_id!r} sent as {request_id} but not decided within {waited_s:g} s: "
            "is a worker running for its context? It starts when one decides it (repeating the start is safe)"
        )
        self.saga_id, self.request_id, self.waited_s = saga_id, request_id, waited_s


class KeyBusy(SagaError):
    """A start of a saga whose concurrency key skips when busy found every slot taken.

    Nothing was started. ``key`` names the key, ``value`` its value (as in Redis keys).
    """

    def __init__(self, message: str, *, key: str, value: str) -> None:
        super().__init__(message)
        self.key, self.value = key, value


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
        self.saga_id, self.step, self.n, self.how = saga_id, step, n, how


class InvalidToken(SagaError):
    """A resume token is malformed, forged, tampered with, expired or for another saga.

    Nothing was delivered. ``reason`` says which; ``saga`` and ``step`` are the saga id and
    the waiting step the token names, when it could be read.
    """

    def __init__(self, reason: str, *, saga: str = "", step: str = "") -> None:
        super().__init__(reason)
        self.reason, self.saga, self.step = reason, saga, step


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
    ``participant`` serves ``context`` with ``partitions``; Redis has ``registered``.
    """

    def __init__(self, participant: str, context: str, partitions: int, registered: int) -> None:
        super().__init__(
            f"participant {participant!r} serves context {context!r} with {partitions} partition(s) "
            f"but {context!r} is registered with {registered}: commands of the other partitions "
            f"would never be handled; pass serves=[saga.Context({context!r}, partitions={registered})]"
        )
        self.participant = participant
        self.context = context
        self.partitions = partitions
        self.registered = registered


class PartitionOutOfRange(SagaError, ValueError):
    """A worker was told to serve partition indexes that no context it serves has.

    ``indexes`` are the indexes at or beyond the partition count of every context in
    ``partitions`` (each context's name and partition count). With contexts of different
    counts an index below the largest count is valid: the smaller contexts have nothing there.
    """

    def __init__(self, indexes: tuple[int, ...], partitions: dict[str, int]) -> None:
        counts = ", ".join(f"{name!r} has {count}" for name, count in sorted(partitions.items()))
        highest = max(partitions.values(), default=0)
        named = ",".join(map(str, indexes))
        super().__init__(
            f"no partition {named} to serve: {counts or 'no context is served'}"
            + (f"; give indexes from 0 to {highest - 1}" if highest else "")
        )
        self.indexes = indexes
        self.partitions = partitions


class ReplayMismatch(SagaError, AssertionError):
    """Replaying a history through the decider decided something else (``mismatch`` says what).

    ``index`` is the history entry that differs and ``step`` the step its decision is about
    (``""`` when none is); ``saga_id`` is the replayed saga. The definition changed in a way
    running sagas would see: make it a new version (``docs/versions.md``).
    """

    def __init__(self, mismatch: Mismatch, *, saga_id: str = "") -> None:
        super().__init__(mismatch.message)
        self.mismatch, self.index, self.step, self.saga_id = mismatch, mismatch.index, mismatch.step, saga_id


class TraceMismatch(SagaError, AssertionError):
    """Replaying an exported trace decided something else, or ended in another state.

    ``mismatch`` is the first differing decision (``None`` when every decision matched and
    only the final state differs); ``differences`` lists what differs in the final state;
    ``saga_id`` and ``definition`` (``name@version``) name the trace's saga.
    """

    def __init__(self, trace: Trace, mismatch: Mismatch | None, differences: list[str]) -> None:
        definition = f"{trace.definition}@{trace.version}"
        head = f"trace of saga {trace.saga_id} ({definition}) does not replay"
        body = mismatch.message if mismatch else "final state differs: " + "; ".join(differences)
        super().__init__(f"{head}: {body}")
        self.trace = trace
        self.mismatch = mismatch
        self.differences = differences
        self.saga_id = trace.saga_id
        self.definition = definition


class RunnerError(SagaError):
    """The in-process runner cannot go on: a mistake in the test's set-up, not a saga outcome.

    For example a command for a participant the runner was not given, a fake without a
    behaviour for a command type, or a reply of the wrong type for its step. ``reason`` says
    what to change; ``participant`` and ``saga_id`` name what it is about, when one is.
    """

    def __init__(self, reason: str, *, participant: str = "", saga_id: str = "") -> None:
        super().__init__(reason)
        self.reason, self.participant, self.saga_id = reason, participant, saga_id


class ChildError(RunnerError):
    """A saga started a child saga (``child``, ``name@version``) the runner was not given."""

    def __init__(self, child: str, *, saga_id: str = "") -> None:
        super().__init__(
            f"give the runner the child saga {child} too (SagaRunner(parent, child, ...))", saga_id=saga_id
        )
        self.child = child


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
        self.action, self.saga_id, self.reason, self.request_id = action, saga_id, reason, request_id


class ScheduleNotFound(SagaError):
    """No schedule has this id in this context."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"no schedule with id {schedule_id!r}")
        self.schedule_id = schedule_id


class ScheduleExists(SagaError):
    """A schedule with this id exists already (pass ``replace=True`` to replace it)."""


__all__ = [
    "ActionRefused",
    "CalendarError",
    "ChildError",
    "CodeRequired",
    "ConcurrentUpdate",
    "CronError",
    "DefinitionError",
    "IllegalTransition",
    "IncompatibleChange",
    "InvalidAnswer",
    "InvalidInput",
    "InvalidSchedule",
    "InvalidToken",
    "KeyBusy",
    "MigrationRefused",
    "NotAuthorized",
    "PartitionMismatch",
    "PartitionOutOfRange",
    "ReplayMismatch",
    "ResultTimeout",
    "RunnerError",
    "SagaCancelled",
    "SagaCompensated",
    "SagaDeadLettered",
    "SagaEnded",
    "SagaError",
    "SagaExists",
    "SagaFailed",
    "SagaNotFound",
    "ScheduleExists",
    "ScheduleNotFound",
    "StartConflict",
    "StartPending",
    "TaskAlreadyClaimed",
    "TaskClosed",
    "TaskError",
    "TaskNotFound",
    "TooManyItems",
    "TraceMismatch",
    "UnknownDefinition",
    "VersionDrained",
    "VersionError",
    "VersionInUse",
    "WaitEnded",
]

for _name in __all__:  # as httpx does: each shows as saga.errors.<name>, whichever module defines it
    globals()[_name].__module__ = __name__
