"""The store in memory: the Redis scripts' rules on dicts, for the in-process runner.

Keeps :class:`~saga.store.protocol.SagaStore`. Its coroutines never suspend (nothing here
waits for anything), so a synchronous caller runs one to its end with :func:`completed`.
Honest differences from Redis: no lease on an inbox entry (there is no inbox), no drained
versions, and the buffer of early events expires by the clock the caller passes (Redis
expires it by its own).
"""

from __future__ import annotations

import itertools
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from bus import Stream
from saga.core.decider import Decision
from saga.core.effects import CancelTimer, StartTimer
from saga.core.history_entry import HistoryEntry
from saga.core.model import Event, SagaState
from saga.store.codec import Loaded, encode_state, state_write
from saga.store.commit import CommitResult, TimerTemplate, WatchRequest
from saga.store.keys import Partition
from saga.store.protocol import StoredTimer
from saga.store.wait_index import BufferedEvent, MemoryIndex, Waiter

T = TypeVar("T")


def completed(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the memory store's) to its end, synchronously."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("a memory store coroutine suspended")


@dataclass(slots=True)
class Saved:
    """One saga as the memory store holds it."""

    loaded: Loaded
    history: list[HistoryEntry]


@dataclass
class MemoryStore:
    """Sagas, timers and the index of event waits in memory (see the module's docstring).

    ``ttl_ms`` and ``cap`` bound the buffer of events that came before their wait, as
    ``EngineConfig.event_buffer_s`` and ``event_buffer_cap`` do in Redis.
    """

    ttl_ms: int
    cap: int
    sagas: dict[tuple[str, str], Saved] = field(default_factory=dict)
    """(partition tag, saga id) -> the saga."""
    pending: dict[str, dict[str, tuple[int, int, StoredTimer]]] = field(default_factory=dict)
    """partition tag -> timer id -> (due, order set, timer)."""
    indexes: dict[str, MemoryIndex] = field(default_factory=dict)
    """context -> its index of waits."""
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def saved(self, partition: Partition, saga_id: str) -> Saved | None:
        """The saga as held (not a copy), or ``None``."""
        return self.sagas.get((partition.tag, saga_id))

    def replace(self, partition: Partition, state: SagaState, entry: HistoryEntry) -> None:
        """Write a saga's state whatever its revision, with one history entry (a migration's)."""
        saved = self.sagas[(partition.tag, state.id)]
        saved.loaded = Loaded(state, encode_state(state))
        saved.history.append(entry)

    async def load(self, partition: Partition, saga_id: str) -> Loaded | None:
        """The saga as stored, or ``None``."""
        saved = self.saved(partition, saga_id)
        return saved.loaded if saved is not None else None

    async def history(self, partition: Partition, saga_id: str) -> list[HistoryEntry]:
        """The saga's history, oldest first."""
        saved = self.saved(partition, saga_id)
        return list(saved.history) if saved is not None else []

    async def commit(
        self, partition: Partition, before: Loaded | None, decision: Decision, event: Event, *, now_ms: int
    ) -> CommitResult:
        """Apply a decision as ``transition.lua`` does (revision check first)."""
        state = decision.state
        saved = self.saved(partition, state.id)
        current = saved.loaded.state.revision if saved is not None else 0
        if current != (before.state.revision if before is not None else 0):
            return CommitResult("conflict", current)
        write = state_write(
            before.state if before else None,
            before.fields if before else {},
            state,
            changed=decision.changed,
            touched=decision.touched,
        )
        entry = HistoryEntry(
            event=event,
            effects=list(decision.effects),
            status=state.status,
            revision=write.revision,
            ignored=decision.ignored,
        )
        if saved is None:
            saved = self.sagas[(partition.tag, state.id)] = Saved(Loaded(state, write.fields), [])
        if decision.changed:
            state.revision = write.revision
            saved.loaded = Loaded(state, write.fields)
        saved.history.append(entry)
        timers = self.pending.setdefault(partition.tag, {})
        for effect in decision.effects:
            if isinstance(effect, StartTimer):
                template = TimerTemplate.of(effect, created_ms=state.created_ms, now_ms=now_ms)
                stored = StoredTimer(effect.timer_id, state.id, template.due_ms, template)
                timers[effect.timer_id] = (template.due_ms, next(self._order), stored)
        for effect in decision.effects:
            if isinstance(effect, CancelTimer):
                timers.pop(effect.timer_id, None)
        return CommitResult("ok", write.revision)

    async def timers(self, partition: Partition) -> list[StoredTimer]:
        """The partition's pending timers, soonest first."""
        return [t for _, _, t in sorted(self.pending.get(partition.tag, {}).values(), key=_soonest)]

    def every_timer(self) -> list[StoredTimer]:
        """Every partition's pending timers, soonest first."""
        return [t for _, _, t in sorted((t for p in self.pending.values() for t in p.values()), key=_soonest)]

    def wake(self, partition: Partition, timer_id: str, now_ms: int) -> None:
        """Make a pending timer due at ``now_ms`` (as ``ZADD XX``: nothing if it is not pending)."""
        timers = self.pending.get(partition.tag, {})
        if timer_id in timers:
            _, order, stored = timers[timer_id]
            timers[timer_id] = (now_ms, order, replace(stored, due_ms=now_ms))

    async def fire_due(self, partition: Partition, now_ms: int) -> list[StoredTimer]:
        """Fire (forget) every timer due at ``now_ms``; soonest first."""
        timers = self.pending.get(partition.tag, {})
        due = [t for t in await self.timers(partition) if t.due_ms <= now_ms]
        for timer in due:
            del timers[timer.timer_id]
        return due

    def index(self, context: str) -> MemoryIndex:
        """The context's index of waits."""
        if context not in self.indexes:
            self.indexes[context] = MemoryIndex(ttl_ms=self.ttl_ms, cap=self.cap)
        return self.indexes[context]

    async def watch(self, context: str, request: WatchRequest, now_ms: int) -> BufferedEvent | None:
        """Register a wait; return a buffered event of its type, if any."""
        return self.index(context).watch(request, now_ms)

    async def unwatch(self, context: str, request: WatchRequest) -> None:
        """Remove an ended wait's registration."""
        self.index(context).unwatch(request)

    async def route(
        self, context: str, stream: Stream, event: BufferedEvent, key: str, now_ms: int
    ) -> list[Waiter]:
        """The waits an event matches; with none, buffer it."""
        return self.index(context).route(stream.key, event, key, now_ms)


def _soonest(item: tuple[int, int, StoredTimer]) -> tuple[int, int]:
    return item[0], item[1]
