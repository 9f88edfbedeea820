"""The in-process runner's sagas: starting, deciding and committing them to the memory store.

Every event goes through :func:`saga.core.decider.decide` (and :func:`saga.core.decider.start`)
and every decision through the store protocol (:class:`~saga.store.memory.MemoryStore`, the
Redis scripts' twin), so revisions, history and timers come out as in Redis. What a
decision sends -- commands, event-wait registrations, a child's report -- is the runner's
transport: ``carry`` gets each committed decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bus import FakeClock, PermanentError
from saga.core.decider import Decision, decide
from saga.core.decider import start as decide_start
from saga.core.history_entry import HistoryEntry
from saga.core.migration import Migration, MigrationDecision, decide_migration
from saga.core.model import (
    CancelRequested,
    Event,
    Kind,
    ParentLink,
    SagaState,
    Started,
    StepReplied,
    TimerPurpose,
)
from saga.core.tokens import Signer
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.errors import RunnerError, SagaExists, SagaNotFound
from saga.runtime.payload_checks import accepted
from saga.store.codec import Loaded, migrated_revision
from saga.store.keys import Partition, partition_of
from saga.store.memory import MemoryStore, Saved, completed
from saga.store.slots import parse_ref
from saga.testing.runner_queue import CONSUMER, EventItem
from saga.testing.runner_rates import MemoryBuckets
from saga.testing.runner_slots import MemorySlots


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
class Record:
    """One saga of the runner: its definition, partition and what the store holds of it."""

    definition: Saga[Any]
    partition: Partition
    saved: Saved

    @property
    def state(self) -> SagaState:
        """The saga's state as stored (not a copy)."""
        return self.saved.loaded.state

    @property
    def history(self) -> list[HistoryEntry]:
        """The saga's history as stored (not a copy)."""
        return self.saved.history


@dataclass
class Sagas:
    """The runner's sagas on a memory store (see the module's docstring)."""

    registry: Registry
    clock: FakeClock
    store: MemoryStore
    new_id: Callable[[str], str]
    signer_for: Callable[[Saga[Any]], Signer | None]
    carry: Callable[[Record, Decision, Event], None]
    """What the runner does with a committed decision's commands (its transport)."""
    records: dict[str, Record] = field(default_factory=dict)
    rates: MemoryBuckets = field(init=False)
    """The rate limits' buckets (the registry's limits), on the virtual clock."""
    slots: MemorySlots = field(init=False)
    """The concurrency keys' lines (the registry's definitions'), on the virtual clock."""

    def __post_init__(self) -> None:
        self.rates = MemoryBuckets(self.registry.limits, self.clock)
        self.slots = MemorySlots(self.registry, self.clock)

    def get(self, saga_id: str) -> Record:
        """The saga ``saga_id`` (:class:`~saga.SagaNotFound` if the runner has none)."""
        try:
            return self.records[saga_id]
        except KeyError:
            raise SagaNotFound(saga_id) from None

    def has(self, saga_id: str) -> bool:
        """Whether the runner has a saga ``saga_id``."""
        return saga_id in self.records

    def start(self, encoded: bytes, definition: Saga[Any], saga_id: str, parent: ParentLink | None) -> str:
        """Start a saga (idempotent by id, like the client); a child carries its ``parent``."""
        existing = self.records.get(saga_id)
        if existing is not None:
            if existing.definition.name != definition.name:
                raise SagaExists(f"saga {saga_id!r} exists and runs {existing.definition.key}")
            return saga_id
        definition.decode_data(encoded)
        context = definition.context
        partition = Partition(context.name, partition_of(saga_id, context.partitions))
        event = Started(
            id=self.new_id("start"),
            at_ms=self.clock.now_ms(),
            data=msgspec.Raw(encoded),
            by=CONSUMER,
            saga=definition.key,
            steps=[s.name for s in definition.steps],
            parent=parent,
        )
        signer = self.signer_for(definition)
        decision = decide_start(definition, saga_id, encoded, partition.index, event, signer=signer)
        self._commit(definition, partition, None, decision, event)
        return saga_id

    def decide(self, item: EventItem) -> Record:
        """Decide an event for its saga (a reply checked as the orchestrator checks it) and commit it."""
        record = self.get(item.saga_id)
        event = item.event
        if isinstance(event, StepReplied) and item.envelope is not None:
            try:
                event = accepted(record.definition, event, item.envelope)
            except PermanentError as error:
                raise RunnerError(
                    f"participant {item.envelope.source!r} replied wrongly: {error}",
                    participant=item.envelope.source,
                    saga_id=item.saga_id,
                ) from error
        decision = decide(record.definition, record.state, event, signer=self.signer_for(record.definition))
        self._commit(record.definition, record.partition, record.saved.loaded, decision, event)
        return record

    def _commit(
        self,
        definition: Saga[Any],
        partition: Partition,
        before: Loaded | None,
        decision: Decision,
        event: Event,
    ) -> None:
        was = None if before is None else before.state
        replaced = self.slots.gate(decision, was, self._wake) if self.slots.active else None
        if self.rates.limits:
            self.rates.gate(decision, was)
        result = completed(self.store.commit(partition, before, decision, event, now_ms=self.clock.now_ms()))
        saved = self.store.saved(partition, decision.state.id)
        if result.outcome != "ok" or saved is None:  # decided on the store's own copy: never stale
            raise RunnerError(
                f"the memory store refused a commit: {result.outcome}", saga_id=decision.state.id
            )
        record = self.records.setdefault(decision.state.id, Record(definition, partition, saved))
        self.carry(record, decision, event)
        if self.slots.active:
            self.slots.release(was, decision.state, self._wake)
        if replaced is not None:  # a later start with the same key replaced it (debounce)
            reason = "replaced by a later start with the same key"
            now = self.clock.now_ms()
            self.decide(
                EventItem(
                    replaced,
                    CancelRequested(id=self.new_id("cancel"), at_ms=now, by="debounce", reason=reason),
                )
            )

    def _wake(self, context: str, ref: str, timer_id: str) -> None:
        """Make a saga's ``slot`` timer due now (a slot freed for it)."""
        self.store.wake(Partition(context, parse_ref(ref)[0]), timer_id, self.clock.now_ms())

    def timers(self, saga_id: str | None = None) -> list[PendingTimer]:
        """The timers that have not fired (of one saga), soonest first."""
        return [
            PendingTimer(
                saga_id=timer.saga_id,
                timer_id=timer.timer_id,
                due_ms=timer.due_ms,
                purpose=timer.template.purpose,
                step=timer.template.step,
                kind=timer.template.kind,
                attempt=timer.template.attempt,
            )
            for timer in self.store.every_timer()
            if saga_id is None or timer.saga_id == saga_id
        ]

    def fire_due(self) -> list[EventItem]:
        """Fire every timer due now, in every partition: their events, soonest first."""
        now = self.clock.now_ms()
        due = [t for t in self.store.every_timer() if t.due_ms <= now]
        for partition in {r.partition for r in self.records.values()}:
            completed(self.store.fire_due(partition, now))
        return [EventItem(timer.saga_id, timer.fired(now)) for timer in due]

    def migrate(self, migration: Migration, saga_id: str | None) -> dict[str, MigrationDecision]:
        """Move in-flight sagas of ``migration.source`` to its target (``SagaRunner.migrate``)."""
        self.registry.get(migration.target.name, migration.target.version)
        decisions: dict[str, MigrationDecision] = {}
        for sid, record in self.records.items():
            if saga_id is not None and sid != saga_id:
                continue
            if record.definition is not migration.source or record.state.status.terminal:
                continue
            decision = decide_migration(
                migration, record.state, event_id=self.new_id("migrate"), at_ms=self.clock.now_ms(), by="test"
            )
            decisions[sid] = decision
            if decision.state is None or decision.event is None:
                continue
            new_state = decision.state
            new_state.revision = migrated_revision(record.state)
            record.definition = migration.target
            entry = HistoryEntry(event=decision.event, status=new_state.status, revision=new_state.revision)
            self.store.replace(record.partition, new_state, entry)
        return decisions
