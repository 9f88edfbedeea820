"""The in-process saga runner: the real decider, in-memory queues and a virtual clock.

Nothing here decides anything: every event goes through :func:`saga.core.decider.decide` (and
:func:`saga.core.decider.start`), every reply through the code a real participant's handler
goes through (``reply_for``, the bus's result encoding and reply envelope, the
orchestrator's output check and ``to_event``), and revisions are counted the way the Redis
store counts them. What the runner replaces is only the transport and the clock:

- one queue holds the commands on their way to participants and the events on their way
  to the orchestrator; it is drained in order (or in a seeded random order, ``reorder=``);
- the bus's idempotent consumer and the participants are :mod:`saga.testing.runner_delivery`;
- sagas, their timers and the index of event waits are a
  :class:`~saga.store.memory.MemoryStore`, which keeps the store protocol the Redis scripts
  keep (one contract suite runs both), on a :class:`~bus.FakeClock` that moves only when the
  test says so (:meth:`SagaRunner.advance`) or when it skips to the next timer
  (:meth:`SagaRunner.run_until_settled`).

The runner wires objects together, each given what it needs: its sagas on the memory
store (``runner_sagas``), the participants (``runner_delivery``), signals and events
(``runner_signals``), child sagas (``runner_children``), schedules (``runner_schedules``),
the event loop (``runner_session``) and what travels on its queue (``runner_queue``).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from bus import FakeClock, Stream, derived_id
from saga.core.decider import Decision
from saga.core.effects import Dispatch, NotifyParent, UnwatchEvent, WatchEvent
from saga.core.history_entry import HistoryEntry
from saga.core.migration import Migration, MigrationDecision
from saga.core.model import (
    CancelRequested,
    Event,
    ForceCompleted,
    RedriveRequested,
    RetryRequested,
    SagaState,
)
from saga.core.query import SagaQuery
from saga.core.states import TERMINAL, SagaStatus
from saga.core.tokens import Signer
from saga.definition.rate import RateLimit
from saga.definition.registry import Registry
from saga.definition.saga import Saga, Step
from saga.definition.schedule import Schedule, ScheduleState
from saga.errors import RunnerError
from saga.runtime.config import EngineConfig
from saga.runtime.participant import Participant
from saga.runtime.tasks import Authorizer
from saga.store.commit import WatchRequest, command_envelope
from saga.store.memory import MemoryStore
from saga.testing.fakes import FakeParticipant, participants_of
from saga.testing.invariants import Summary, invariant_violations, replay, summarize
from saga.testing.runner_children import Children
from saga.testing.runner_delivery import Deliveries, local_actions
from saga.testing.runner_queue import CONSUMER, CommandItem, EventItem, Item, Published, Watch
from saga.testing.runner_sagas import PendingTimer, Record, Sagas
from saga.testing.runner_schedules import Schedules
from saga.testing.runner_session import Session
from saga.testing.runner_signals import Signals
from saga.testing.runner_tasks import RunnerTasks, anyone

DEFAULT_START_MS = 1_700_000_000_000
_json = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(SagaState)


class SagaRunner:
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
    initial time. Human tasks: :attr:`tasks` (``authorize`` is the application's authorizer;
    by default anyone may act). ``limits``: rate limits, whose buckets the virtual clock fills.
    """

    def __init__(
        self,
        *sagas: Saga[Any],
        participants: Iterable[Participant | FakeParticipant] = (),
        start_time: datetime | None = None,
        reorder: random.Random | None = None,
        config: EngineConfig | None = None,
        max_deliveries: int = 100_000,
        authorize: Authorizer = anyone,
        limits: Iterable[RateLimit] = (),
    ) -> None:
        if not sagas:
            raise ValueError("SagaRunner needs at least one saga definition")
        self.registry = Registry(sagas, limits=limits)
        self.config = config or EngineConfig()
        self.clock = FakeClock(int(start_time.timestamp() * 1000) if start_time else DEFAULT_START_MS)
        self.dispatched: list[tuple[str, Dispatch]] = []
        """Every command the sagas sent, in order, as (saga id, dispatch)."""
        self.store = MemoryStore(ttl_ms=self.config.event_buffer_s * 1000, cap=self.config.event_buffer_cap)
        """The sagas, their timers and the index of event waits."""
        self._reorder = reorder
        self._max_deliveries = max_deliveries
        self._queue: list[Item] = []
        self._ids = itertools.count(1)
        self._session = Session()
        self._sagas = Sagas(
            self.registry, self.clock, self.store, self._new_id, self._signer_for, self._carry
        )  # fmt: skip
        self._signals = Signals(
            self.registry, self.config, self.clock, self.store, self.state,
            lambda saga_id: self._saga(saga_id).definition, self._sagas.has, self._new_id, self._queue.append,
        )  # fmt: skip
        self._children = Children(
            self.registry, self.clock, self._sagas.has, self._new_id, self._queue.append, self._sagas.start
        )
        self._schedules = Schedules(
            self.registry, self.config, self.clock,
            lambda data, definition, saga_id: self.start(data, definition=definition, saga_id=saga_id),
            lambda saga_id, reason, by: self.cancel(saga_id, reason=reason, by=by),
            lambda saga_id: not self._sagas.has(saga_id) or self.status(saga_id).terminal,
        )  # fmt: skip
        self.tasks = RunnerTasks(
            self.registry, config=self.config, clock=self.clock, session=self._session,
            enqueue=self._queue.append, signer=self.signer,
            partition_of=lambda saga_id: self._saga(saga_id).partition, authorize=authorize,
        )  # fmt: skip
        self._deliveries = Deliveries(
            self.tasks.beside(participants_of(participants)), self.config, self.clock,
            local_actions(self.registry, self.signer), self._queue.append,
            self._children.command, self._ids,
        )  # fmt: skip
        self.calls = self._deliveries.calls
        """Every command delivered to a participant (local actions aside), in delivery order."""

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
        saga_id = saga_id or f"{definition.name}-{len(self._sagas.records) + 1}"
        return self._sagas.start(encoded, definition, saga_id, None)

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
        self._deliveries.paused.setdefault(participant, [])

    def resume(self, participant: str) -> None:
        """Bring a paused participant back; its backlog is delivered in order on the next run."""
        self._deliveries.resume(participant)

    # -- signals, events, queries, schedules (runner_signals, runner_schedules) -------------

    def signer(self, context: str) -> Signer:
        """The signer of ``context`` (from ``EngineConfig.signal_secret``, else a test secret)."""
        return self._signals.signer(context)

    def resume_token(self, saga_id: str, step: str | Step[Any, Any]) -> str:
        """The resume token of ``step``'s current (or next) wait, as ``ctx.resume_token`` makes it."""
        return self._signals.resume_token(saga_id, step)

    def signal(self, token: str, data: object = None, *, by: str = "test") -> None:
        """Deliver a resume token with ``data``, as ``SagaClient.signal`` does (checks included)."""
        self._signals.signal(token, data, by=by)

    def publish(self, stream: str | Stream, message: object, *, message_id: str | None = None) -> str:
        """Publish another context's event on ``stream`` (seen on the next run); return its id."""
        return self._signals.publish(stream, message, message_id=message_id)

    def query(self, saga_id: str) -> SagaQuery:
        """What ``SagaClient.query`` answers: status, current step, wait (until, token), deadline."""
        return self._signals.query(saga_id)

    def add_schedule(self, schedule: Schedule, *, replace: bool = False) -> None:
        """Store a schedule; its first occurrence is the first one at or after now."""
        self._schedules.add_schedule(schedule, replace=replace)

    def schedule_state(self, schedule_id: str) -> ScheduleState:
        """A copy of the schedule's state (what it started, skipped, buffered)."""
        return self._schedules.schedule_state(schedule_id)

    def pause_schedule(self, schedule_id: str) -> None:
        """Pause: occurrences are skipped until :meth:`resume_schedule`."""
        self._schedules.pause_schedule(schedule_id)

    def resume_schedule(self, schedule_id: str) -> None:
        """Resume from the next occurrence after now."""
        self._schedules.resume_schedule(schedule_id)

    def trigger_schedule(self, schedule_id: str) -> None:
        """Run once now (the overlap policy applies) on the next run or advance."""
        self._schedules.trigger_schedule(schedule_id)

    def _signer_for(self, definition: Saga[Any]) -> Signer | None:
        return self._signals.signer_for(definition)

    # -- running ---------------------------------------------------------------------------

    def run_until_idle(self) -> None:
        """Deliver and decide everything that can happen without time passing.

        Timers due now fire (a retry without back-off, say); later ones wait for
        :meth:`advance`.
        """
        self._session.run(self._settle_now)

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

        def body() -> None:
            self._settle_now()
            while (due := self._next_due(self._schedules.next_due())) is not None and due <= target:
                self.clock.set(max(due, self.now_ms))
                self._settle_now()
            self.clock.set(target)

        self._session.run(body)

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
            ids = [saga_id] if saga_id is not None else list(self._sagas.records)
            return all(self._saga(i).state.status in _SETTLED for i in ids)

        def body() -> None:
            self._settle_now()
            while not settled() and (due := self._next_due()) is not None and due <= deadline:
                self.clock.set(max(due, self.now_ms))
                self._settle_now()

        self._session.run(body)

    # -- reading ---------------------------------------------------------------------------

    @property
    def saga_ids(self) -> list[str]:
        """Every saga started, in order."""
        return list(self._sagas.records)

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
        return self._deliveries.participant(name)

    def timers(self, saga_id: str | None = None) -> list[PendingTimer]:
        """The timers that have not fired (of one saga), soonest first."""
        return self._sagas.timers(saga_id)

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
        return self._sagas.migrate(migration, saga_id)

    def assert_invariants(self) -> None:
        """Fail if any saga broke G2-G4 (docs/faults.md) or the lifecycle (see ``invariant_violations``).

        Also checks that no participant applied an effect twice for one idempotency key.
        """
        problems = [
            f"{saga_id}: {problem}"
            for saga_id, record in self._sagas.records.items()
            for problem in invariant_violations(record.definition, record.state, record.history)
        ] + self._deliveries.effects_twice()
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

    def _saga(self, saga_id: str) -> Record:
        return self._sagas.get(saga_id)

    def _new_id(self, label: str) -> str:
        return derived_id(CONSUMER, f"{label}:{next(self._ids)}")

    def _request(self, saga_id: str, event: Event) -> None:
        self._saga(saga_id)
        self._queue.append(EventItem(saga_id, event))

    def _settle_now(self) -> None:
        while True:
            self._drain()
            fired = self._sagas.fire_due()
            self._queue.extend(fired)
            if not len(fired) + self._schedules.fire() + self.tasks.fire_due():
                return

    def _drain(self) -> None:
        for _ in range(self._max_deliveries):
            if not self._queue:
                return
            index = self._reorder.randrange(len(self._queue)) if self._reorder else 0
            item = self._queue.pop(index)
            if isinstance(item, CommandItem):
                self._session.wait(self._deliveries.handle(item))
            elif isinstance(item, Watch):
                self._signals.handle_watch(item)
            elif isinstance(item, Published):
                self._signals.handle_published(item)
            else:
                self._decide(item)
            self._session.check()
        if self._queue:
            raise RunnerError(f"still busy after {self._max_deliveries} deliveries (a livelock?)")

    def _next_due(self, *more: int | None) -> int | None:
        """The next saga or task timer (or of ``more``): what ``advance`` and ``run_until_settled`` seek."""
        due = [*(t.due_ms for t in self.store.every_timer()), self.tasks.next_due(), *more]
        return min((t for t in due if t is not None), default=None)

    def _decide(self, item: EventItem) -> None:
        self._deliveries.release_late(self._sagas.decide(item).state)

    def _carry(self, record: Record, decision: Decision, event: Event) -> None:
        """Carry a committed decision's commands as the streams would."""
        state, partition = record.state, record.partition
        for effect in decision.effects:
            if isinstance(effect, Dispatch):
                envelope = command_envelope(state, effect, partition, cause=event.id, now_ms=self.now_ms)
                self.dispatched.append((state.id, effect))
                self._queue.append(CommandItem(state.id, partition, effect.participant, envelope))
            elif isinstance(effect, WatchEvent | UnwatchEvent):
                request = WatchRequest.of(state.id, partition.index, effect)
                kind = "WatchEvent" if isinstance(effect, WatchEvent) else "UnwatchEvent"
                self._queue.append(Watch(partition.context, kind, request))
            elif isinstance(effect, NotifyParent):
                self._children.notify_parent(state, effect, record.definition)


_SETTLED = frozenset({*TERMINAL, SagaStatus.DEAD_LETTERED})
