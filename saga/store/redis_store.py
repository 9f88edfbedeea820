"""The store protocol on Redis: the transition, timer and wait-index scripts, one call each.

The runtime sends these same calls batched in pipelines (the orchestrator's commits, the
timer firing loop, the event routing); this class runs them one at a time, so that the
store contract suite (``tests/saga/test_store_contract.py``) holds the scripts and the
in-memory store to the same behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bus import Stream
from bus.lowlevel import redis_errors, run_batch
from saga.core.decider import Decision
from saga.core.history_entry import HistoryEntry
from saga.core.model import Event
from saga.store import wait_index
from saga.store.branches import load_saga
from saga.store.codec import Loaded
from saga.store.commit import CommitResult, TimerTemplate, WatchRequest, commit_call, commit_result
from saga.store.history import read_history
from saga.store.keys import Partition
from saga.store.protocol import StoredTimer
from saga.store.scripts import FIRE_TIMERS
from saga.store.trust import orchestrator_of
from saga.store.wait_index import BufferedEvent, Waiter


@dataclass(frozen=True, slots=True)
class RedisStore:
    """:class:`~saga.store.protocol.SagaStore` on a Redis client (see the module's docstring).

    ``ttl_ms`` and ``cap`` bound the buffer of early events (``EngineConfig.event_buffer_s``
    and ``event_buffer_cap``); ``retention_s`` is how long an ended saga is kept.
    """

    redis: Any
    ttl_ms: int
    cap: int
    retention_s: int = 0

    async def load(self, partition: Partition, saga_id: str) -> Loaded | None:
        """The saga as stored (with its branch records), or ``None``."""
        return await load_saga(self.redis, partition, saga_id)

    async def history(self, partition: Partition, saga_id: str) -> list[HistoryEntry]:
        """The saga's history, oldest first (none once its hash is gone: it expires with it).

        Read before the saga, so the saga holds every record the entries refer to.
        """
        with redis_errors():
            raw = await self.redis.lrange(partition.history(saga_id), 0, -1)
        loaded = await load_saga(self.redis, partition, saga_id) if raw else None
        return read_history(raw, loaded.state) if loaded is not None else []

    async def commit(
        self, partition: Partition, before: Loaded | None, decision: Decision, event: Event, *, now_ms: int
    ) -> CommitResult:
        """Run the transition script for ``decision``."""
        call, _ = commit_call(
            partition,
            before,
            decision,
            event,
            delivery=None,
            now_ms=now_ms,
            timer_now_ms=now_ms,
            retention_s=self.retention_s,
        )
        return commit_result(await call.run(self.redis))

    async def timers(self, partition: Partition) -> list[StoredTimer]:
        """The partition's pending timers, soonest first."""
        with redis_errors():
            due = await self.redis.zrange(partition.timers, 0, -1, withscores=True)
            stored = await self.redis.hmget(partition.timer_data, [t for t, _ in due]) if due else []
        found = []
        for (raw_id, score), data in zip(due, stored, strict=True):
            timer_id = raw_id.decode()
            saga_id, template = TimerTemplate.parse(data)
            found.append(StoredTimer(timer_id, saga_id, int(score), template))
        return found

    async def fire_due(self, partition: Partition, now_ms: int) -> list[StoredTimer]:
        """Fire every timer due at ``now_ms`` onto the partition's inbox (``fire_timers.lua``)."""
        due = [t for t in await self.timers(partition) if t.due_ms <= now_ms]
        call = FIRE_TIMERS.call(
            [partition.timers, partition.timer_data, partition.inbox.key],
            [now_ms, len(due), orchestrator_of(partition.context)],
        )
        (result,) = await run_batch(self.redis, [call])
        if isinstance(result, BaseException):
            raise result
        return due

    async def watch(self, context: str, request: WatchRequest, now_ms: int) -> BufferedEvent | None:  # noqa: ARG002 - Redis expires the buffer by its own clock
        """Register a wait (``watch_event.lua``); the buffer expires by Redis's clock, not ``now_ms``."""
        return await wait_index.watch(self.redis, context, request)

    async def unwatch(self, context: str, request: WatchRequest) -> None:
        """Remove an ended wait's registration."""
        await wait_index.unwatch(self.redis, context, request)

    async def route(
        self,
        context: str,
        stream: Stream,
        event: BufferedEvent,
        key: str,
        now_ms: int,  # noqa: ARG002 - Redis expires the buffer by its own clock
    ) -> list[Waiter]:
        """Route an event (``route_event.lua``); the buffer expires by Redis's clock."""
        return await wait_index.route(
            self.redis, context, stream, event, key, ttl_ms=self.ttl_ms, cap=self.cap
        )
