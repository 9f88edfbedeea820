"""The in-process saga runner: the real decider, in-memory queues and a virtual clock.

Nothing here decides anything: every event goes through :func:`saga.core.decider.decide` (and
:func:`saga.core.decider.start`), every reply through the code a real participant's handler
goes through (``reply_for``, the bus's result encoding and reply envelope, the
orchestrator's output check and ``to_event``), and revisions are counted the way the Redis
store counts them. What the runner replaces is only the transport and the clock:

- one queue holds the commands on their way to participants and the events on their way
  to the orchestrator; it is drained in order (or in a seeded random order, ``reorder=``);
- the bus's idempotent consumer is a dict from (participant, idempotency key) to the first
  result, so a repeat is answered without running the handler again, as in production --
  and, as in production, forgotten ``BusConfig.dedupe_ttl_s`` (virtual time) later;
- timers are a dict of due times on a :class:`~bus.FakeClock` that moves only when the test
  says so (:meth:`SagaRunner.advance`) or when it skips to the next timer
  (:meth:`SagaRunner.run_until_settled`).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import msgspec

from bus import Delivery, Envelope, FakeClock, MalformedEntry, PermanentError, Reply, derived_id
from bus.lowlevel import encode_result, reply_envelope
from saga.core.child_messages import CHILD
from saga.core.decider import Decision, LocalCall, decide
from saga.core.decider import start as decide_start
from saga.core.migration import Migration, MigrationDecision, decide_migration
from saga.core.model import (
    CancelRequested,
    CancelTimer,
    Dispatch,
    Event,
    ForceCompleted,
    HistoryEntry,
    Kind,
    NotifyParent,
    ParentLink,
    RedriveRequested,
    RetryRequested,
    SagaState,
    Started,
    StartTimer,
    StepReplied,
    TimerPurpose,
    UnwatchEvent,
    WatchEvent,
)
from saga.core.states import SagaStatus
from saga.definition.registry import Registry
from saga.definition.saga import LOCAL, Saga, Step
from saga.errors import SagaError, SagaExists, SagaNotFound
from saga.runtime.config import EngineConfig
from saga.runtime.orchestrator import Orchestrator
from saga.runtime.participant import CommandContext, Participant
from saga.runtime.payload_checks import accepted
from saga.runtime.protocol import StepFailed, to_event
from saga.runtime.step_reply import reply_for
from saga.store.codec import encode_state, state_write
from saga.store.commit import TimerTemplate, WatchRequest, command_envelope
from saga.store.keys import Partition, partition_of
from saga.testing.fakes import Call, CallOutcome, FakeParticipant, Response, participants_of
from saga.testing.invariants import Summary, invariant_violations, replay, summarize
from saga.testing.runner_children import RunnerChildren
from saga.testing.runner_schedules import RunnerSchedules
from saga.testing.runner_signals import Published, RunnerWaits, Watch

T = TypeVar("T")
CONSUMER = "saga-runner"
"""The consumer name the runner's deliveries carry (attempts record it as their worker)."""
DEFAULT_START_MS = 1_700_000_000_000
_json = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(SagaState)


class RunnerError(SagaError):
    """The runner cannot go on: a test set-up mistake, not a saga outcome.

    For example a command for a participant the runner was not given, a fake without a
    behaviour for a command type, or a reply of the wrong type for its step.
    """


@dataclass(frozen=True, slots=True)
class PendingTimer:
    """A timer that has not fired yet."""

    saga_id: str
    timer_id: str
    due_ms: int
    purpose: TimerPurpose
    step: str
    kind: Kind
    attempt: int


@dataclass(slots=True)
class _Saga:
    definition: Saga[Any]
    partition: Partition
    state: SagaState
    fields: dict[str, bytes]
    history: list[HistoryEntry]


@dataclass(frozen=True, slots=True)
class _Command:
    saga_id: str
    partition: Partition
    participant: str
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class _Event:
    saga_id: str
    event: Event
    envelope: Envelope | None = None


@dataclass(frozen=True, slots=True)
class _Held:
    item: _Event
    step: str
    kind: Kind
    command_id: str


class SagaRunner(RunnerWaits, RunnerSchedules, RunnerChildren):
    """Runs sagas in-process and synchronously: no Redis, no real time, the real decider.

    Example::

        runner = SagaRunner(order_fulfilment, participants=[inventory, payments, shipping])
        saga_id = runner.start(order)
        runner.run_until_idle()             # deliver and decide everything due now
        runner.advance(minutes=5)           # fire the timers due in the next 5 minutes
        assert runner.state(saga_id).status == "completed"

    ``participants`` are :class:`~saga.testing.FakeParticipant` objects or real
    :class:`~saga.Participant` objects (their handlers run in-process; see
    :meth:`participant` for what they received). Local actions run for real.

    Adding work (:meth:`start`, :meth:`cancel`, :meth:`retry`, :meth:`force_complete`,
    :meth:`signal`, :meth:`publish`, :meth:`add_schedule`) decides or enqueues it and
    returns; :meth:`run_until_idle`, :meth:`advance` and :meth:`run_until_settled` deliver
    and decide. ``reorder`` (a seeded
    :class:`random.Random`) takes the queued commands and events in random order instead of
    first-in first-out, as concurrent workers may. ``start_time`` is the virtual clock's
    initial time.
    """

    def __init__(
        self,
        *sagas: Saga[Any],
        participants: Iterable[Participant | FakeParticipant] = (),
        start_time: datetime | None = None,
        reorder: random.Random | None = None,
        config: EngineConfig | None = None,
        max_deliveries: int = 100_000,
    ) -> None:
        if not sagas:
            raise ValueError("SagaRunner needs at least one saga definition")
        self.registry = Registry(sagas)
        self.config = config or EngineConfig()
        self.clock = FakeClock(int(start_time.timestamp() * 1000) if start_time else DEFAULT_START_MS)
        self.dispatched: list[tuple[str, Dispatch]] = []
        """Every command the sagas sent, in order, as (saga id, dispatch)."""
        self.calls: list[Call] = []
        """Every command delivered to a participant (local actions aside), in delivery order."""
        self._participants = participants_of(participants)
        self._reorder = reorder
        self._max_deliveries = max_deliveries
        self._sagas: dict[str, _Saga] = {}
        self._queue: list[_Command | _Event | Watch | Published] = []
        self._held: list[_Held] = []
        self._timers: dict[str, tuple[int, int, str, StartTimer]] = {}
        self._dedupe: dict[tuple[str, str], tuple[bytes, int]] = {}
        self._paused: dict[str, list[_Command]] = {}
        self._ids = itertools.count(1)
        self._busy = False
        self._misuse: RunnerError | None = None
        self._loop: asyncio.Runner | None = None
        self._signers = {}
        self._schedules = {}
        self._indexes = {}
        self._delivered = set()
        self._locals: dict[str, Orchestrator] = {}
        for context in self.registry.contexts.values():
            local = Orchestrator(None, self.registry, context, clock=self.clock, config=self.config)
            local._signer = self.signer(context.name)
            self._locals[context.name] = local

    # -- time ------------------------------------------------------------------------------

    @property
    def now_ms(self) -> int:
        """The virtual time, Unix milliseconds."""
        return self.clock.now_ms()

    @property
    def now(self) -> datetime:
        """The virtual time as an aware UTC datetime."""
        return datetime.fromtimestamp(self.now_ms / 1000, tz=UTC)

    # -- adding work -----------------------------------------------------------------------

    def start(self, data: object, *, definition: Saga[Any] | None = None, saga_id: str | None = None) -> str:
        """Start a saga with ``data`` (its first step is dispatched, not yet delivered); return its id.

        ``definition`` may be left out when the runner has one saga (its newest version is
        started). Ids default to
        ``<saga name>-<n>``; starting an existing id again returns it (like the client).
        """
        definition = self._definition(definition)
        encoded = definition.encode_data(data)
        saga_id = saga_id or f"{definition.name}-{len(self._sagas) + 1}"
        return self._start_linked(encoded, definition, saga_id, None)

    def _start_linked(
        self, encoded: bytes, definition: Saga[Any], saga_id: str, parent: ParentLink | None
    ) -> str:
        existing = self._sagas.get(saga_id)
        if existing is not None:
            if existing.definition.name != definition.name:
                raise SagaExists(f"saga {saga_id!r} exists and runs {existing.definition.key}")
            return saga_id
        definition.decode_data(encoded)
        context = definition.context
        partition = Partition(context.name, partition_of(saga_id, context.partitions))
        event = Started(
            id=self._new_id("start"),
            at_ms=self.now_ms,
            data=msgspec.Raw(encoded),
            by=CONSUMER,
            saga=definition.key,
            steps=[s.name for s in definition.steps],
            parent=parent,
        )
        decision = decide_start(
            definition, saga_id, encoded, partition.index, event, signer=self._signer_for(definition)
        )
        record = _Saga(definition, partition, decision.state, {}, [])
        self._sagas[saga_id] = record
        self._commit(record, decision, event)
        return saga_id

    def run(
        self, data: object, *, definition: Saga[Any] | None = None, saga_id: str | None = None
    ) -> SagaState:
        """Start a saga and run it until it settles (skipping time); return its final state."""
        saga_id = self.start(data, definition=definition, saga_id=saga_id)
        self.run_until_settled(saga_id)
        return self.state(saga_id)

    def cancel(self, saga_id: str, *, reason: str = "", by: str = "test") -> None:
        """Ask for the saga to be cancelled (decided in order with its other events)."""
        self._request(
            saga_id, CancelRequested(id=self._new_id("cancel"), at_ms=self.now_ms, by=by, reason=reason)
        )

    def retry(self, saga_id: str, *, reason: str = "", by: str = "test") -> None:
        """Operator retry of a dead-lettered saga's failed step or compensation."""
        self._request(
            saga_id, RetryRequested(id=self._new_id("retry"), at_ms=self.now_ms, by=by, reason=reason)
        )

    def force_complete(
        self,
        saga_id: str,
        step: str | Step[Any, Any],
        output: object = None,
        *,
        reason: str = "forced by a test",
        by: str = "test",
    ) -> None:
        """Operator force-completion of a stuck step (or failed compensation) with ``output``."""
        record = self._saga(saga_id)
        name = step if isinstance(step, str) else step.name
        raw = _json.encode(output)
        record.definition.step_named(name).decode_output(raw)  # InvalidInput on a wrong output
        event = ForceCompleted(
            id=self._new_id("force"),
            at_ms=self.now_ms,
            step=name,
            output=msgspec.Raw(raw),
            by=by,
            reason=reason,
        )
        self._request(saga_id, event)

    def redrive(
        self,
        saga_id: str,
        step: str | Step[Any, Any],
        *,
        reason: str = "redriven by a test",
        by: str = "test",
    ) -> None:
        """Operator redrive: run the saga again from ``step`` (``saga replay --from-step``)."""
        name = step if isinstance(step, str) else step.name
        event = RedriveRequested(
            id=self._new_id("redrive"), at_ms=self.now_ms, step=name, by=by, reason=reason
        )
        self._request(saga_id, event)

    def pause(self, participant: str) -> None:
        """Take a participant down: its commands wait, unanswered, until :meth:`resume`.

        Use it with step timeouts: attempts time out while it is down, and when it comes
        back it works through the backlog, so replies to old attempts arrive late.
        """
        self.participant(participant)
        self._paused.setdefault(participant, [])

    def resume(self, participant: str) -> None:
        """Bring a paused participant back; its backlog is delivered in order on the next run."""
        self._queue.extend(self._paused.pop(participant, []))

    # -- running ---------------------------------------------------------------------------

    def run_until_idle(self) -> None:
        """Deliver and decide everything that can happen without time passing.

        Timers due now fire (a retry without back-off, say); later ones wait for
        :meth:`advance`.
        """
        self._session(self._settle_now)

    def advance(
        self,
        delta: timedelta | None = None,
        *,
        days: float = 0,
        hours: float = 0,
        minutes: float = 0,
        seconds: float = 0,
    ) -> None:
        """Move the virtual clock forward, firing each timer at its due time in due order.

        Everything is delivered and decided at each firing, so a timer set by a decision
        during the advance fires too if it falls due before the end.
        """
        total = (delta or timedelta()) + timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        if total < timedelta():
            raise ValueError("time only moves forward")
        target = self.now_ms + int(total.total_seconds() * 1000)

        def next_due() -> int | None:
            due = [t for t in (self._next_due(), self._next_schedule_due()) if t is not None]
            return min(due, default=None)

        def body() -> None:
            self._settle_now()
            while (due := next_due()) is not None and due <= target:
                self.clock.set(max(due, self.now_ms))
                self._settle_now()
            self.clock.set(target)

        self._session(body)

    def run_until_settled(
        self, saga_id: str | None = None, *, within: timedelta = timedelta(days=365)
    ) -> None:
        """Run, skipping to each next timer, until the saga (or every saga) has settled.

        Settled means ended or dead-lettered. It also returns when nothing is left to happen
        (a command that will never be answered and has no timeout) or when the next timer is
        more than ``within`` away.
        """
        deadline = self.now_ms + int(within.total_seconds() * 1000)

        def settled() -> bool:
            ids = [saga_id] if saga_id is not None else list(self._sagas)
            return all(self._saga(i).state.status in _SETTLED for i in ids)

        def body() -> None:
            self._settle_now()
            while not settled() and (due := self._next_due()) is not None and due <= deadline:
                self.clock.set(max(due, self.now_ms))
                self._settle_now()

        self._session(body)

    # -- reading ---------------------------------------------------------------------------

    @property
    def saga_ids(self) -> list[str]:
        """Every saga started, in order."""
        return list(self._sagas)

    def state(self, saga_id: str) -> SagaState:
        """A copy of the saga's current state."""
        return _state_decoder.decode(_json.encode(self._saga(saga_id).state))

    def status(self, saga_id: str) -> SagaStatus:
        """The saga's lifecycle status."""
        return self._saga(saga_id).state.status

    def history(self, saga_id: str) -> list[HistoryEntry]:
        """The saga's history: every event, what was decided, and the resulting status."""
        return list(self._saga(saga_id).history)

    def summary(self, saga_id: str) -> Summary:
        """Status, step records and compensation order, as compared across backends."""
        record = self._saga(saga_id)
        return summarize(record.state, record.history)

    def participant(self, name: str) -> FakeParticipant:
        """The participant called ``name`` (real ones are wrapped: see ``calls``)."""
        try:
            return self._participants[name]
        except KeyError:
            raise RunnerError(f"no participant {name!r} (known: {sorted(self._participants)})") from None

    def timers(self, saga_id: str | None = None) -> list[PendingTimer]:
        """The timers that have not fired (of one saga), soonest first."""
        return [
            PendingTimer(
                saga_id=owner,
                timer_id=timer.timer_id,
                due_ms=due,
                purpose=timer.purpose,
                step=timer.step,
                kind=timer.kind,
                attempt=timer.attempt,
            )
            for due, _, owner, timer in sorted(self._timers.values(), key=lambda t: (t[0], t[1]))
            if saga_id is None or owner == saga_id
        ]

    def replay(self, saga_id: str) -> SagaState:
        """Replay the saga's history through the decider (see :func:`saga.testing.replay`)."""
        record = self._saga(saga_id)
        return replay(
            self.registry,
            record.history,
            saga_id=saga_id,
            partition=record.partition.index,
            signer=self._signer_for(record.definition),
        )

    def migrate(self, migration: Migration, saga_id: str | None = None) -> dict[str, MigrationDecision]:
        """Move in-flight sagas of ``migration.source`` to its target, as ``saga versions migrate`` does.

        The same function, checks and history record as in production, so a test can pin
        what a migration does to sagas at each step. Applies to one saga, or to every
        in-flight saga of the source version; returns each one's decision (refused and
        skipped sagas are untouched). Both versions must be given to the runner.
        """
        self.registry.get(migration.target.name, migration.target.version)
        decisions: dict[str, MigrationDecision] = {}
        for sid, record in self._sagas.items():
            if saga_id is not None and sid != saga_id:
                continue
            if record.definition is not migration.source or record.state.status.terminal:
                continue
            decision = decide_migration(
                migration, record.state, event_id=self._new_id("migrate"), at_ms=self.now_ms, by="test"
            )
            decisions[sid] = decision
            if decision.state is None or decision.event is None:
                continue
            new_state = decision.state
            new_state.revision = record.state.revision + 1
            record.definition, record.state, record.fields = (
                migration.target,
                new_state,
                encode_state(new_state),
            )
            record.history.append(
                HistoryEntry(event=decision.event, status=new_state.status, revision=new_state.revision)
            )
        return decisions

    def assert_invariants(self) -> None:
        """Fail if any saga broke G2-G4 (docs/faults.md) or the lifecycle (see ``invariant_violations``).

        Also checks that no participant applied an effect twice for one idempotency key.
        """
        problems = [
            f"{saga_id}: {problem}"
            for saga_id, record in self._sagas.items()
            for problem in invariant_violations(record.definition, record.state, record.history)
        ]
        for fake in self._participants.values():
            try:
                fake.assert_each_effect_once()
            except AssertionError as error:
                problems.append(str(error))
        if problems:
            raise AssertionError("saga invariants broken:\n  " + "\n  ".join(problems))

    # -- internals -------------------------------------------------------------------------

    def _definition(self, definition: Saga[Any] | None) -> Saga[Any]:
        if definition is not None:
            return self.registry.get(definition.name, definition.version)
        names = {d.name for d in self.registry}
        if len(names) != 1:
            raise RunnerError("this runner has several sagas: pass definition=")
        return self.registry.latest(names.pop())

    def _saga(self, saga_id: str) -> _Saga:
        try:
            return self._sagas[saga_id]
        except KeyError:
            raise SagaNotFound(saga_id) from None

    def _new_id(self, label: str) -> str:
        return derived_id(CONSUMER, f"{label}:{next(self._ids)}")

    def _request(self, saga_id: str, event: Event) -> None:
        self._saga(saga_id)
        self._queue.append(_Event(saga_id, event))

    def _enqueue(self, item: object) -> None:
        assert isinstance(item, _Command | _Event | Watch | Published)  # noqa: S101 - internal use
        self._queue.append(item)

    def _enqueue_event(self, saga_id: str, event: Event) -> None:
        self._request(saga_id, event)

    def _enqueue_reply(self, saga_id: str, event: Event, envelope: Envelope) -> None:
        self._queue.append(_Event(saga_id, event, envelope))

    def _has_saga(self, saga_id: str) -> bool:
        return saga_id in self._sagas

    def _definition_of(self, saga_id: str) -> Saga[Any]:
        return self._saga(saga_id).definition

    def _session(self, body: Callable[[], None]) -> None:
        """Run ``body`` with an event loop for handlers and actions; from async code, on a thread."""
        if self._busy:
            # Raised inside a handler, where it would pass for a transient failure: remember it
            # so that the outer call raises it too.
            self._misuse = RunnerError("the runner was called from a handler or action it is running")
            raise self._misuse
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:  # called from async code (an async test): its loop is busy, so use our own thread
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="saga-runner") as pool:
                pool.submit(self._session, body).result()
            return
        self._busy = True
        try:
            body()
        finally:
            self._busy = False
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    def _await(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            self._loop = asyncio.Runner()
        return self._loop.run(coroutine)

    def _settle_now(self) -> None:
        while True:
            self._drain()
            if not self._fire_due() + self._fire_schedules():
                return

    def _drain(self) -> None:
        for _ in range(self._max_deliveries):
            if not self._queue:
                return
            index = self._reorder.randrange(len(self._queue)) if self._reorder else 0
            item = self._queue.pop(index)
            if isinstance(item, _Command):
                self._deliver(item)
            elif isinstance(item, Watch):
                self._handle_watch(item)
            elif isinstance(item, Published):
                self._handle_published(item)
            else:
                self._decide(item)
            if self._misuse is not None:
                misuse, self._misuse = self._misuse, None
                raise misuse
        if self._queue:
            raise RunnerError(f"still busy after {self._max_deliveries} deliveries (a livelock?)")

    def _next_due(self) -> int | None:
        return min((t[0] for t in self._timers.values()), default=None)

    def _fire_due(self) -> int:
        now = self.now_ms
        due = sorted((t for t in self._timers.values() if t[0] <= now), key=lambda t: (t[0], t[1]))
        for _, _, saga_id, timer in due:
            del self._timers[timer.timer_id]
            event = TimerTemplate.of(timer).fired(timer.timer_id, now)
            self._queue.append(_Event(saga_id, event))
        return len(due)

    def _decide(self, item: _Event) -> None:
        record = self._saga(item.saga_id)
        event = item.event
        if isinstance(event, StepReplied) and item.envelope is not None:
            try:
                event = accepted(record.definition, event, item.envelope)
            except PermanentError as error:
                raise RunnerError(f"participant {item.envelope.source!r} replied wrongly: {error}") from error
        signer = self._signer_for(record.definition)
        self._commit(record, decide(record.definition, record.state, event, signer=signer), event)
        self._release_late(record)

    def _commit(self, record: _Saga, decision: Decision, event: Event) -> None:
        """Apply a decision the way the transition script does (revision, history, effects)."""
        status = decision.state.status
        write = state_write(
            record.state, record.fields, decision.state, changed=decision.changed, touched=decision.touched
        )
        revision = write.revision
        if decision.changed:
            record.state, record.fields = decision.state, write.fields
            record.state.revision = revision
        record.history.append(
            HistoryEntry(
                event=event,
                effects=list(decision.effects),
                status=status,
                revision=revision,
                ignored=decision.ignored,
            )
        )
        saga_id = record.state.id
        for effect in decision.effects:
            if isinstance(effect, StartTimer):
                due = effect.at_ms if effect.at_ms is not None else self.now_ms + effect.delay_ms
                self._timers[effect.timer_id] = (due, next(self._ids), saga_id, effect)
        for effect in decision.effects:
            if isinstance(effect, CancelTimer):
                self._timers.pop(effect.timer_id, None)
        for effect in decision.effects:
            if isinstance(effect, Dispatch):
                envelope = command_envelope(
                    record.state, effect, record.partition, cause=event.id, now_ms=self.now_ms
                )
                self.dispatched.append((saga_id, effect))
                self._queue.append(_Command(saga_id, record.partition, effect.participant, envelope))
            elif isinstance(effect, WatchEvent | UnwatchEvent):
                request = WatchRequest.of(saga_id, record.partition.index, effect)
                kind = "WatchEvent" if isinstance(effect, WatchEvent) else "UnwatchEvent"
                self._queue.append(Watch(record.partition.context, kind, request))
            elif isinstance(effect, NotifyParent):
                self._notify_parent(record.state, effect, record.definition)

    def _deliver(self, command: _Command) -> None:
        self._await(self._handle(command))

    async def _handle(self, command: _Command) -> None:
        """Deliver one command as the bus would: idempotent consumer first, then the handler."""
        envelope = command.envelope
        name = command.participant
        if name in self._paused:
            self._paused[name].append(command)
            return
        delivery = Delivery(
            envelope=envelope,
            stream=command.partition.commands(name),
            group=name,
            entry_id=f"0-{next(self._ids)}",
            deliveries=1,
            consumer=CONSUMER,
        )
        key = (name, envelope.idempotency_key)
        if name == CHILD:
            self._child_command(envelope)
            return
        if name == LOCAL:
            first = self._first_result(key)
            if first is None:
                local = self._locals[command.partition.context]
                reply = await local.on_local(envelope.decode(LocalCall), delivery)
                first = self._result(key, reply, idempotent=True)
            self._reply(command, LOCAL, first, Response(None))
            return
        fake = self.participant(name)
        found = fake.behaviour(envelope.type)
        if found is None:
            raise RunnerError(
                f"participant {name!r} has no behaviour for {envelope.type} (sent by step "
                f"{envelope.headers.get('step')!r}); add one with .on({envelope.type}, ...)"
            )
        message = envelope.decode(found[0])
        ctx = CommandContext.of(delivery)
        first = self._first_result(key) if fake.idempotent else None
        if first is not None:
            fake.calls.append(self._call(name, message, ctx, envelope, "replayed"))
            self._reply(command, name, first, Response(None))
            return
        response = found[1].respond(message, ctx)
        if response.handler is None:
            fake.calls.append(self._call(name, message, ctx, envelope, "lost"))
        else:
            reply = await reply_for(response.handler(message, ctx), wrap=False)
            result = self._result(key, reply, idempotent=fake.idempotent)
            fake.calls.append(self._call(name, message, ctx, envelope, _outcome_of(reply)))
            self._reply(command, name, result, response)
        if response.redeliver:
            self._queue.append(command)

    def _first_result(self, key: tuple[str, str]) -> bytes | None:
        """The key's first result, unless the bus would have forgotten it (``dedupe_ttl_s``)."""
        recorded = self._dedupe.get(key)
        if recorded is None or self.now_ms - recorded[1] >= self.config.bus.dedupe_ttl_s * 1000:
            return None
        return recorded[0]

    def _result(self, key: tuple[str, str], reply: Any, *, idempotent: bool) -> bytes:
        """Encode a handler's reply; remember it as the key's first result as the bus does."""
        result = encode_result(reply, self.config.bus)
        if idempotent and (not isinstance(reply, Reply) or reply.remember):
            self._dedupe[key] = (result, self.now_ms)
        return result

    def _call(
        self, name: str, message: Any, ctx: CommandContext, envelope: Envelope, outcome: CallOutcome
    ) -> Call:
        call = Call(
            participant=name,
            message=message,
            saga_id=ctx.saga_id,
            step=ctx.step,
            kind=ctx.kind,
            attempt=ctx.attempt,
            command_id=envelope.id,
            idempotency_key=envelope.idempotency_key,
            at_ms=self.now_ms,
            outcome=outcome,
        )
        self.calls.append(call)
        return call

    def _reply(self, command: _Command, name: str, result: bytes, response: Response) -> None:
        reply = reply_envelope(
            command.envelope, result, source=name, consumer=f"{name}@{CONSUMER}", now_ms=self.now_ms
        )
        if reply is None:
            return
        try:
            event = to_event(reply)
        except MalformedEntry as error:
            raise RunnerError(f"participant {name!r} replied with something unusable: {error}") from error
        item = _Event(command.saga_id, event, reply)
        assert isinstance(event, StepReplied)  # noqa: S101 - replies always decode as StepReplied
        for _ in range(max(1, response.copies)):
            if response.late:
                self._held.append(_Held(item, event.step, event.kind, event.command_id))
            else:
                self._queue.append(item)

    def _release_late(self, record: _Saga) -> None:
        """Deliver held replies whose attempt the saga has given up on (timed out, moved on)."""
        keep: list[_Held] = []
        for held in self._held:
            mine = held.item.saga_id == record.state.id
            step = (
                (record.state.steps.get(held.step) or record.state.branches.get(held.step)) if mine else None
            )
            attempt = step.current(held.kind) if step is not None else None
            if held.item.saga_id != record.state.id or (
                attempt is not None and attempt.command_id == held.command_id and attempt.outcome is None
            ):
                keep.append(held)
            else:
                self._queue.append(held.item)
        self._held = keep


_SETTLED = frozenset(
    {
        SagaStatus.COMPLETED,
        SagaStatus.FAILED,
        SagaStatus.COMPENSATED,
        SagaStatus.CANCELLED,
        SagaStatus.DEAD_LETTERED,
    }
)


def _outcome_of(reply: Any) -> CallOutcome:
    message = reply.message if isinstance(reply, Reply) else reply
    if isinstance(message, StepFailed):
        return "permanent" if message.permanent else "transient"
    return "ok"
