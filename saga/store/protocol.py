"""The store protocol: what a decision's effects need from wherever sagas live.

Two implementations keep it: :class:`~saga.store.redis_store.RedisStore` (the Lua scripts
the runtime runs) and :class:`~saga.store.memory.MemoryStore` (the in-process runner's).
One contract suite (``tests/saga/test_store_contract.py``) runs on memory, fakeredis and
real Redis, so the runner applies a decision exactly as the transition script does::

    load / history         read a saga (state, hash fields, tag) and its history
    commit                 apply one decision: revision check, state (the one revision
                           rule, saga.store.codec.state_write), history, timers started
                           and cancelled; "conflict" with the current revision when
                           ``before`` is stale, and nothing written
    timers / fire_due      the partition's pending timers; fire those due (each once)
    watch / unwatch        register or remove an event wait in the context's index
    route                  the waits an event matches, or buffer it for a later wait

What is not here is transport: the commands a decision dispatches and the inbox entry
that carried its event (the runtime's streams, the runner's queue). The runtime batches
these same calls in pipelines (``saga/runtime/orchestrator.py``); the Redis store runs
them one at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bus import Stream
from saga.core.decider import Decision
from saga.core.history_entry import HistoryEntry
from saga.core.model import Event, TimerFired
from saga.store.codec import Loaded
from saga.store.commit import CommitResult, TimerTemplate, WatchRequest
from saga.store.keys import Partition
from saga.store.wait_index import BufferedEvent, Waiter


@dataclass(frozen=True, slots=True)
class StoredTimer:
    """A pending timer: whose, when, and the event it fires."""

    timer_id: str
    saga_id: str
    due_ms: int
    template: TimerTemplate

    def fired(self, at_ms: int) -> TimerFired:
        """The event the saga sees when this timer fires at ``at_ms``."""
        return self.template.fired(self.timer_id, at_ms)


class SagaStore(Protocol):
    """Where sagas, their timers and the index of event waits live (see the module's docstring)."""

    async def load(self, partition: Partition, saga_id: str) -> Loaded | None:
        """The saga as stored (with its branch records), or ``None``."""
        ...

    async def history(self, partition: Partition, saga_id: str) -> list[HistoryEntry]:
        """The saga's history, oldest first."""
        ...

    async def commit(
        self, partition: Partition, before: Loaded | None, decision: Decision, event: Event, *, now_ms: int
    ) -> CommitResult:
        """Apply ``decision`` (made on ``before``) for ``event``; timers are due from ``now_ms``."""
        ...

    async def timers(self, partition: Partition) -> list[StoredTimer]:
        """The partition's pending timers, soonest first."""
        ...

    async def fire_due(self, partition: Partition, now_ms: int) -> list[StoredTimer]:
        """Fire every timer due at ``now_ms`` (each once: it is no longer pending); soonest first."""
        ...

    async def watch(self, context: str, request: WatchRequest, now_ms: int) -> BufferedEvent | None:
        """Register a wait; return a buffered event of its type that came before it, if any."""
        ...

    async def unwatch(self, context: str, request: WatchRequest) -> None:
        """Remove an ended wait's registration."""
        ...

    async def route(
        self, context: str, stream: Stream, event: BufferedEvent, key: str, now_ms: int
    ) -> list[Waiter]:
        """The waits an event with correlation ``key`` matches; with none, it is buffered."""
        ...
