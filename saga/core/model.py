"""A saga's recorded state and the events that move it.

All of it is msgspec Structs: the store writes them as JSON, the decider reads and returns
them, history keeps events (and the effects of ``saga/core/effects.py``) verbatim, with
every input and output, so replay can run the decider again and compare. Schema rules: new
fields get defaults; a tag is never reused.
"""

from __future__ import annotations

from typing import Literal, TypeVar

import msgspec
from msgspec.structs import replace

from saga.core.states import SagaStatus, StepStatus

Kind = Literal["do", "undo", "confirm"]
"""What an attempt does: the step itself, its compensation, or (TCC steps) its confirmation."""
NULL = msgspec.Raw(b"null")
"""JSON ``null`` as a raw value: the default of optional raw fields (msgspec cannot decode
``Raw | None``)."""
Outcome = Literal["ok", "transient", "permanent", "timeout", "cancelled", "forced"]
TimerPurpose = Literal["retry", "timeout", "wake", "deadline", "expiry", "rate", "slot"]
"""Why a timer exists: a retry back-off, an attempt's or a wait's timeout, the end of a sleep,
the saga's deadline, the expiry of a TCC step's reservation, or an attempt's command waiting
for its rate limit's token (``saga/core/rate_rules.py``)."""
WaitKind = Literal["sleep", "signal", "event"]


_S = TypeVar("_S", bound=msgspec.Struct)


def _copied(value: _S | None) -> _S | None:
    return None if value is None else replace(value)


class Attempt(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """One attempt of a step (``do``) or of its compensation (``undo``)."""

    n: int
    kind: Kind
    command_id: str
    participant: str
    input_type: str
    input: msgspec.Raw
    dispatched_ms: int
    ended_ms: int | None = None
    outcome: Outcome | None = None
    output: msgspec.Raw = NULL
    error: str | None = None
    worker: str | None = None


class GroupState(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """Where a group step's branches are (parallel, first-of-N and map steps).

    Kept in the group step's own record, so its size depends on the concurrency limit, not
    on the number of branches: each branch's record lives in the saga's branch hash (see
    ``saga/store/commit.py``), under ``<group>#<index>``. Branches are started in index order;
    branch ``i`` has been started when ``i < started``.
    """

    total: int
    """How many branches this run of the group has (fixed when the group begins)."""
    started: int = 0
    running: list[int] = msgspec.field(default_factory=list)
    """Branches in flight (dispatched, or waiting to retry): at most the concurrency limit."""
    succeeded: int = 0
    failed: int = 0
    """Branches that ended without taking effect (failed, or cancelled before they were sent)."""
    completions: int = 0
    """Branches completed so far; each completed branch records its rank in ``StepState.seq``."""
    closed: str = ""
    """Why no further branch is started (a branch failed, a winner was found, a cancel)."""
    winner: int = -1
    """First-of-N: the branch whose output is the group's output."""


class StepState(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """Where one step (or one branch of a group step) is, with every attempt of it."""

    status: StepStatus = StepStatus.PENDING
    attempts: list[Attempt] = msgspec.field(default_factory=list)
    output: msgspec.Raw = NULL
    timer: str | None = None
    generation: int = 0
    """Bumped when an operator redrive re-runs a step whose earlier attempts are known to
    have had no effect: its commands then carry a fresh idempotency key (see
    :func:`idempotency_key`), so a participant that remembered the failure runs again."""
    group: GroupState | None = None
    """A group step's branches (``None`` for every other step)."""
    seq: int = 0
    """A branch's rank in its group's completion order (1 = first to complete; 0 = not yet)."""
    rewait: int = 0
    """Set when an operator redrive interrupted this step's wait ``rewait``: the step's next
    wait is that wait again, so the resume token sent for it still resumes the saga (0: the
    next wait is a new one)."""

    def current(self, kind: Kind) -> Attempt | None:
        """The latest attempt of ``kind``."""
        for attempt in reversed(self.attempts):
            if attempt.kind == kind:
                return attempt
        return None

    def count(self, kind: Kind) -> int:
        """How many attempts of ``kind`` were made."""
        return sum(1 for a in self.attempts if a.kind == kind)

    def copy(self) -> StepState:
        """A copy whose attempts and group may be changed without touching this record."""
        group = self.group
        return replace(
            self,
            attempts=[replace(attempt) for attempt in self.attempts],
            group=None if group is None else replace(group, running=list(group.running)),
        )


class Note(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """Why the saga is where it is: the last error, a cancel request, an operator action."""

    at_ms: int
    what: str
    by: str = ""
    reason: str = ""
    step: str = ""


class Wait(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """What a suspended saga waits for: wait ``n`` of step ``step``.

    When it ends (the timer, signal or event came, it timed out, or the saga was cancelled)
    is judged by the timer clock; the due time lives in the timers set, not here.
    """

    step: str
    kind: WaitKind
    n: int
    since_ms: int
    stream: str = ""
    message_type: str = ""
    key: str = ""


class ParentLink(msgspec.Struct, gc=False, kw_only=True, frozen=True):
    """Where a child saga reports its end: the parent's step attempt that started it."""

    context: str
    partition: int
    saga_id: str
    saga: str
    """The parent's definition, ``name@version``."""
    step: str
    """The parent's step (or branch, ``<group>#<index>``) that waits for this child."""
    attempt: int
    command_id: str
    """The id of the parent's command that started the child: the end report names it."""
    incarnation: int = 0
    """The parent's incarnation (its creation time, ms), which the end report carries back so
    that a report copied into a later parent under the same id is refused (0: a link made
    before it was recorded)."""


class SagaState(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """Everything the engine knows about one saga.

    ``revision`` is the optimistic-concurrency version: every transition checks it and
    increments it, so a stale worker's commit is refused.
    """

    id: str
    name: str
    version: int
    context: str
    partition: int
    status: SagaStatus
    data: msgspec.Raw
    steps: dict[str, StepState]
    cursor: int = 0
    completed: list[str] = msgspec.field(default_factory=list)
    cancel: Note | None = None
    error: Note | None = None
    """The last note (``saga inspect``'s "last note"): the failure that stopped or turned the
    saga back (a failed attempt, an expired reservation, the deadline) or, once an operator
    moved it on, their retry, force-complete or redrive; the failure itself stays in its
    attempt and in the history."""
    revision: int = 0
    created_ms: int = 0
    updated_ms: int = 0
    wait: Wait | None = None
    expired: Note | None = None
    signals: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)
    """Signals that came before their wait began, by ``<step>:<wait number>`` (and events
    that came for a wait an operator redrive interrupted, before it began again)."""
    branches: dict[str, StepState] = msgspec.field(default_factory=dict)
    """The branches of group steps that have started, by ``<group>#<index>`` (stored apart
    from the saga hash; see ``saga/store/commit.py``)."""
    parent: ParentLink | None = None
    """Set when the saga is a child saga: whom it reports its end to."""
    trace: str = ""
    """The W3C ``traceparent`` of the saga's start (``""``: not traced). Every command,
    follow-up after a timer and child saga it sends carries it, so its spans form one trace
    whichever worker sends them (``bus/_tracing.py``)."""
    trace_state: str = ""
    """The W3C ``tracestate`` that came with :attr:`trace`."""
    stamped: bool = False
    """Whether every command, timer and child link of this saga names its incarnation (a saga
    started by a release that stamps them all): a reply, timer firing or child's end report
    without the stamps is then refused as a replay of an entry written before."""

    def outputs(self) -> dict[str, bytes]:
        """Raw outputs of the steps that succeeded (even if undone since), by step name."""
        return {name: bytes(self.steps[name].output) for name in self.completed}

    def working_copy(self) -> SagaState:
        """A copy a decision may change freely, except the step and branch records it shares.

        ``steps`` and ``branches`` are new dicts holding the same records: a decision copies
        a record (:meth:`StepState.copy`) before it changes it, and changes one or two a time.
        This copies exactly the other mutable parts, several times faster than a JSON round
        trip (this runs once per decision); ``tests/saga/test_model_copies.py`` checks that no
        mutable object is shared, field by field, so a new field cannot be forgotten here.
        """
        return replace(
            self,
            steps=dict(self.steps),
            completed=list(self.completed),
            cancel=_copied(self.cancel),
            error=_copied(self.error),
            wait=_copied(self.wait),
            expired=_copied(self.expired),
            signals=dict(self.signals),
            branches=dict(self.branches),
        )


# Events: what happened to a saga. ``id`` is the id of the message that carried it.


class Started(msgspec.Struct, gc=False, tag="started", kw_only=True):
    """The saga was created with its data.

    ``saga`` is the definition it started on (``name@version``) and ``steps`` the steps it
    runs, so that a replay picks that version's definition and knows which steps the saga
    has even after a step was appended to the version (both empty in histories recorded
    before they were added).
    """

    id: str
    at_ms: int
    data: msgspec.Raw
    by: str = ""
    saga: str = ""
    steps: list[str] = msgspec.field(default_factory=list)
    parent: ParentLink | None = None


class StepReplied(msgspec.Struct, gc=False, tag="replied", kw_only=True, omit_defaults=True):
    """A participant (or a local action) answered one attempt of a step or compensation."""

    id: str
    at_ms: int
    step: str
    kind: Kind
    attempt: int
    command_id: str
    ok: bool
    output: msgspec.Raw = NULL
    error: str | None = None
    error_type: str | None = None
    permanent: bool = False
    worker: str = ""


class TimerFired(msgspec.Struct, gc=False, tag="timer", kw_only=True):
    """A durable timer came due.

    A back-off elapsed, an attempt or a wait timed out, a sleep ended, or the deadline passed.
    """

    id: str
    at_ms: int
    timer_id: str
    purpose: TimerPurpose
    step: str
    kind: Kind
    attempt: int


# Operator requests carry ``expected_revision``: the revision the operator (or the admin
# client) saw when deciding to act. When it is set and the saga has moved since, the request
# is recorded and ignored, so an action judged on a stale picture never applies (0: no check).


class CancelRequested(msgspec.Struct, gc=False, tag="cancel", kw_only=True):
    """Someone asked to cancel the saga (completed steps are compensated)."""

    id: str
    at_ms: int
    by: str = ""
    reason: str = ""
    expected_revision: int = 0


class RetryRequested(msgspec.Struct, gc=False, tag="retry", kw_only=True):
    """An operator asked to retry the dead-lettered step or compensation now."""

    id: str
    at_ms: int
    by: str = ""
    reason: str = ""
    expected_revision: int = 0


class ForceCompleted(msgspec.Struct, gc=False, tag="force_completed", kw_only=True):
    """An operator marked a stuck step (or compensation) done with a given output."""

    id: str
    at_ms: int
    step: str
    output: msgspec.Raw
    by: str
    reason: str
    expected_revision: int = 0


class RedriveRequested(msgspec.Struct, gc=False, tag="redrive", kw_only=True):
    """An operator asked to re-run a stuck saga from ``step``, keeping earlier outputs.

    Allowed while the saga runs, waits or is dead-lettered on a forward step, from a step
    it has reached; see ``docs/operations.md`` (redrive) for the rules and why they are safe.
    """

    id: str
    at_ms: int
    step: str
    by: str
    reason: str
    expected_revision: int = 0


class SignalReceived(msgspec.Struct, gc=False, tag="signal", kw_only=True, omit_defaults=True):
    """Someone delivered a resume token for wait ``n`` of a signal step, with its data."""

    id: str
    at_ms: int
    step: str
    n: int
    data: msgspec.Raw = NULL
    by: str = ""


class EventReceived(msgspec.Struct, gc=False, tag="event", kw_only=True):
    """Another context's event matched wait ``n`` of an event step."""

    id: str
    at_ms: int
    step: str
    n: int
    event_id: str
    message_type: str
    payload: msgspec.Raw


OperatorEvent = CancelRequested | RetryRequested | ForceCompleted | RedriveRequested
Event = (
    Started
    | StepReplied
    | TimerFired
    | CancelRequested
    | RetryRequested
    | ForceCompleted
    | RedriveRequested
    | SignalReceived
    | EventReceived
)


class Migrated(msgspec.Struct, gc=False, tag="migrated", kw_only=True, omit_defaults=True):
    """An operator moved the saga from one definition version to another (a migration).

    Not a decider event: the migrate script writes the new state directly. It records
    everything the migration decided -- the step mapping (source step name -> target step
    name, for every step the saga has a record of), the new data, replaced step outputs and
    the target steps the saga skips -- so replay applies it again without the user's
    migration function (``saga.core.migration.migrate_state``).
    """

    id: str
    at_ms: int
    from_version: int
    to_version: int
    steps: dict[str, str]
    data: msgspec.Raw
    outputs: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)
    skip: list[str] = msgspec.field(default_factory=list)
    by: str = ""
    reason: str = ""


Recorded = Event | Migrated
"""What a history entry records: a decider event, or a migration."""
