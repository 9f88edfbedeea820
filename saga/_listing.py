"""Listing sagas from the indexes: by status, definition and version, or by time stuck.

Sources are the per-partition sorted sets the transition script maintains (``idx:<status>``
scored by when the saga entered the status; ``active`` scored by when a non-ended saga
last moved), read in windows and merged across partitions in score order: oldest (or
stalest) first. Filters on definition and version read two hash fields per candidate, in
pipelined batches. Nothing scans the keyspace.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from bus._errors import redis_errors
from saga._keys import Partition
from saga._states import SagaStatus

_WINDOW: Final = 200
_FIELDS: Final = ("name", "version", "status", "updated", "rev")


class SagaRow(msgspec.Struct, kw_only=True):
    """One saga in a listing.

    ``since_ms`` is the index score: when it entered its status, or (listing stuck sagas)
    when it last moved; ``idle_ms`` is how long ago it last moved.
    """

    id: str
    definition: str
    version: int
    status: SagaStatus
    context: str
    partition: int
    since_ms: int
    updated_ms: int
    idle_ms: int
    revision: int


class SagaPage(msgspec.Struct, kw_only=True):
    """A page of a listing; pass ``next_offset`` as ``offset`` for the next one."""

    rows: list[SagaRow]
    offset: int
    limit: int
    next_offset: int | None


@dataclass(frozen=True, slots=True)
class Query:
    """Which sagas to list.

    Attributes:
        statuses: Only these statuses (all when empty).
        definition: Only this definition name.
        version: Only this definition version.
        stuck_for_ms: Only sagas that have not moved for this long (not ended ones), stalest first.

    """

    statuses: tuple[SagaStatus, ...] = ()
    definition: str | None = None
    version: int | None = None
    stuck_for_ms: int | None = None

    def keys(self, partition: Partition) -> list[str]:
        """The index keys of ``partition`` this query reads."""
        if self.stuck_for_ms is not None:
            return [partition.active]
        return [partition.by_status(s.value) for s in (self.statuses or tuple(SagaStatus))]

    def accepts(self, row: SagaRow) -> bool:
        """Whether a candidate from the indexes matches every filter."""
        return self.accepts_count(row.definition, row.version, row.status)

    def accepts_count(self, definition: str, version: int, status: SagaStatus) -> bool:
        """Whether sagas of ``definition@version`` in ``status`` match every filter."""
        if self.statuses and status not in self.statuses:
            return False
        if self.definition is not None and definition != self.definition:
            return False
        return self.version is None or version == self.version


@dataclass(slots=True)
class _Index:
    """One index key read in windows of ``_WINDOW``."""

    key: str
    partition: Partition
    max_score: float
    read: int = 0
    done: bool = False
    buffer: list[tuple[float, str]] = field(default_factory=list)

    async def fill(self, redis: Any) -> None:
        if self.buffer or self.done:
            return
        with redis_errors():
            top = "+inf" if self.max_score == float("inf") else int(self.max_score)
            rows = await redis.zrangebyscore(
                self.key, "-inf", top, start=self.read, num=_WINDOW, withscores=True
            )
        self.read += len(rows)
        self.done = len(rows) < _WINDOW
        self.buffer = [(float(score), member.decode()) for member, score in reversed(rows)]


async def list_sagas(
    redis: Any, partitions: Sequence[Partition], query: Query, *, now_ms: int, offset: int, limit: int
) -> SagaPage:
    """One page of the sagas matching ``query``, in index order."""
    rows: list[SagaRow] = []
    skipped = 0
    async for row in _matching(redis, partitions, query, now_ms):
        if skipped < offset:
            skipped += 1
            continue
        if len(rows) == limit:
            return SagaPage(rows=rows, offset=offset, limit=limit, next_offset=offset + limit)
        rows.append(row)
    return SagaPage(rows=rows, offset=offset, limit=limit, next_offset=None)


async def count_sagas(redis: Any, partitions: Sequence[Partition], query: Query, *, now_ms: int) -> int:
    """How many sagas match ``query`` (walks the matching index entries)."""
    return sum([1 async for _ in _matching(redis, partitions, query, now_ms)])


async def _matching(redis: Any, partitions: Sequence[Partition], query: Query, now_ms: int) -> Any:
    cutoff = float("inf") if query.stuck_for_ms is None else now_ms - query.stuck_for_ms
    indexes = [_Index(key, p, cutoff) for p in partitions for key in query.keys(p)]
    heap: list[tuple[float, str, int]] = []
    for n, index in enumerate(indexes):
        await index.fill(redis)
        if index.buffer:
            score, member = index.buffer.pop()
            heapq.heappush(heap, (score, member, n))
    while heap:
        batch: list[tuple[float, str, int]] = []
        while heap and len(batch) < _WINDOW:
            score, member, n = heapq.heappop(heap)
            batch.append((score, member, n))
            index = indexes[n]
            await index.fill(redis)
            if index.buffer:
                next_score, next_member = index.buffer.pop()
                heapq.heappush(heap, (next_score, next_member, n))
        for row in await _rows(redis, [(s, m, indexes[n].partition) for s, m, n in batch], now_ms):
            if query.accepts(row):
                yield row


async def _rows(redis: Any, batch: list[tuple[float, str, Partition]], now_ms: int) -> list[SagaRow]:
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            for _, saga_id, partition in batch:
                pipe.hmget(partition.saga(saga_id), *_FIELDS)
            replies = await pipe.execute()
    rows = []
    for (score, saga_id, partition), values in zip(batch, replies, strict=True):
        if values[0] is None:
            continue  # an ended saga that has expired since; its index entry outlives it
        updated = int(values[3])
        rows.append(
            SagaRow(
                id=saga_id,
                definition=values[0].decode(),
                version=int(values[1]),
                status=SagaStatus(values[2].decode()),
                context=partition.context,
                partition=partition.index,
                since_ms=int(score),
                updated_ms=updated,
                idle_ms=max(0, now_ms - updated),
                revision=int(values[4] or 0),
            )
        )
    return rows
