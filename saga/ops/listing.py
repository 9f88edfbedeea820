"""Listing sagas from the indexes: by status, definition and version, or by time stuck.

Sources are the per-partition sorted sets the transition script maintains (``idx:<status>``
scored by when the saga last moved, or ended; the unfinished statuses' indexes for stuck
sagas), read in windows and merged across partitions in score order: stalest first, or
newest first. A time range bounds the scores read. Filters on definition, version and a
part of the id read a few hash fields per candidate, in pipelined batches. Nothing scans
the keyspace; a search for part of an id walks the status indexes it reads.

*Stuck* means not moved for a while and not waiting as designed: a saga suspended on a
sleep, signal or event whose own deadline (the wait's timer) is still ahead, or that waits
without a timeout, is *waiting*, and counted apart (:func:`waiting`).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import msgspec

from bus.lowlevel import redis_errors
from saga.core.states import SagaStatus
from saga.errors import InvalidInput
from saga.store.codec import decode_meta
from saga.store.keys import Partition
from saga.store.records import decode_timer

if TYPE_CHECKING:
    from saga.ops.stats import SagaCount  # stats reads this module: a name for types only

_WINDOW: Final = 200
_MOVING: Final = tuple(s for s in SagaStatus if not s.terminal and s != SagaStatus.SUSPENDED)
"""The unfinished statuses but suspended: a saga in them that has not moved is stuck."""
_FIELDS: Final = ("name", "version", "status", "updated", "rev", "created")


class SagaRow(msgspec.Struct, kw_only=True):
    """One saga in a listing.

    ``since_ms`` is the index score: when it last moved (an ended saga: when it ended),
    by Redis's clock or the injected one; ``idle_ms`` is how long ago it last moved, by
    the ``updated`` time its last transition wrote.
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
    created_ms: int = 0

    def duration_ms(self, now_ms: int) -> int:
        """How long it ran: start to end when ended, else start to ``now_ms``."""
        end = self.updated_ms if self.status.terminal else now_ms
        return max(0, end - self.created_ms)


class SagaPage(msgspec.Struct, kw_only=True):
    """A page of a listing; pass ``next_offset`` as ``offset`` for the next one.

    ``total`` is how many sagas match over all pages. Listing stuck sagas, ``waiting``
    counts those left out because they wait within their wait's deadline (else ``None``).
    """

    rows: list[SagaRow]
    offset: int
    limit: int
    next_offset: int | None
    total: int = 0
    waiting: int | None = None


@dataclass(frozen=True, slots=True)
class Query:
    """Which sagas to list.

    Attributes:
        statuses: Only these statuses (all when empty).
        definition: Only this definition name.
        version: Only this definition version.
        stuck_for_ms: Only sagas that have not moved for this long (not ended ones), stalest first.
        moved_after_ms: Only sagas that last moved (or ended) at or after this time.
        moved_before_ms: Only sagas that last moved (or ended) at or before this time.
        newest_first: Most recently moved first (default: stalest first).
        id_contains: Only sagas whose id holds this text.

    """

    statuses: tuple[SagaStatus, ...] = ()
    definition: str | None = None
    version: int | None = None
    stuck_for_ms: int | None = None
    moved_after_ms: int | None = None
    moved_before_ms: int | None = None
    newest_first: bool = False
    id_contains: str = ""

    @property
    def counted(self) -> bool:
        """Whether the counters give this query's total (no time, stuck or id filter)."""
        return (
            self.stuck_for_ms is None
            and self.moved_after_ms is None
            and self.moved_before_ms is None
            and not self.id_contains
        )

    @classmethod
    def parse(
        cls,
        status: str | SagaStatus | Sequence[str | SagaStatus],
        definition: str | None,
        version: int | None,
        stuck_for_ms: int | None,
        *,
        moved_after_ms: int | None = None,
        moved_before_ms: int | None = None,
        newest_first: bool = False,
        id_contains: str = "",
    ) -> Query:
        """The query the arguments of a listing call ask for (:class:`InvalidInput` if they cannot)."""
        statuses = [status] if isinstance(status, str) else list(status)
        try:
            parsed = tuple(SagaStatus(s) for s in statuses)
        except ValueError:
            known = ", ".join(s.value for s in SagaStatus)
            raise InvalidInput(f"unknown status in {statuses} (known: {known})") from None
        if stuck_for_ms is not None and stuck_for_ms < 0:
            raise InvalidInput("stuck_for_ms must not be negative")
        if moved_after_ms is not None and moved_before_ms is not None and moved_after_ms > moved_before_ms:
            raise InvalidInput("the time range ends before it begins")
        return cls(
            statuses=parsed,
            definition=definition,
            version=version,
            stuck_for_ms=stuck_for_ms,
            moved_after_ms=moved_after_ms,
            moved_before_ms=moved_before_ms,
            newest_first=newest_first,
            id_contains=id_contains,
        )

    def keys(self, partition: Partition) -> list[str]:
        """The index keys of ``partition`` this query reads."""
        statuses = self.statuses or tuple(SagaStatus)
        if self.stuck_for_ms is not None:  # an ended saga is not stuck
            statuses = tuple(s for s in statuses if not s.terminal)
        return [partition.by_status(s.value) for s in statuses]

    def accepts(self, row: SagaRow) -> bool:
        """Whether a candidate from the indexes matches every filter."""
        return self.id_contains in row.id and self.accepts_count(row.definition, row.version, row.status)

    def matching(self, counts: Sequence[SagaCount]) -> list[SagaCount]:
        """The counters (per definition, version and status) this query's filters keep."""
        return [c for c in counts if self.accepts_count(c.definition, c.version, c.status)]

    def score_range(self, now_ms: int) -> tuple[float, float]:
        """The index scores this query reads: its time range, and the stuck cutoff."""
        low = float("-inf") if self.moved_after_ms is None else float(self.moved_after_ms)
        high = float("inf") if self.moved_before_ms is None else float(self.moved_before_ms)
        if self.stuck_for_ms is not None:
            high = min(high, now_ms - self.stuck_for_ms)
        return low, high

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
    min_score: float
    max_score: float
    newest_first: bool = False
    read: int = 0
    done: bool = False
    buffer: list[tuple[float, str]] = field(default_factory=list)

    async def fill(self, redis: Any) -> None:
        if self.buffer or self.done:
            return
        low = "-inf" if self.min_score == float("-inf") else int(self.min_score)
        high = "+inf" if self.max_score == float("inf") else int(self.max_score)
        with redis_errors():
            if self.newest_first:
                rows = await redis.zrevrangebyscore(
                    self.key, high, low, start=self.read, num=_WINDOW, withscores=True
                )
            else:
                rows = await redis.zrangebyscore(
                    self.key, low, high, start=self.read, num=_WINDOW, withscores=True
                )
        self.read += len(rows)
        self.done = len(rows) < _WINDOW
        self.buffer = [(float(score), member.decode()) for member, score in reversed(rows)]


async def list_sagas(
    redis: Any,
    partitions: Sequence[Partition],
    query: Query,
    *,
    now_ms: int,
    offset: int,
    limit: int,
    total: int | None = None,
) -> SagaPage:
    """One page of the sagas matching ``query``, in index order.

    ``total``, when the caller knows it (from the counters), saves walking past the page;
    listing stuck sagas always walks them all (only the walk can tell waiting ones apart).
    """
    walk = Walk(query)
    walk_all = total is None or not query.counted
    rows: list[SagaRow] = []
    matched = 0
    async for row in walk.rows(redis, partitions, now_ms):
        matched += 1
        if offset < matched <= offset + limit:
            rows.append(row)
        elif matched > offset + limit and not walk_all:
            break
    return SagaPage(
        rows=rows,
        offset=offset,
        limit=limit,
        next_offset=offset + limit if matched > offset + limit else None,
        total=matched if walk_all or total is None else total,
        waiting=walk.waiting if query.stuck_for_ms is not None else None,
    )


async def matching_rows(
    redis: Any, partitions: Sequence[Partition], query: Query, *, now_ms: int
) -> tuple[list[SagaRow], int | None]:
    """Every saga matching ``query``, and (listing stuck sagas) how many were left out waiting."""
    walk = Walk(query)
    rows = [row async for row in walk.rows(redis, partitions, now_ms)]
    return rows, walk.waiting if query.stuck_for_ms is not None else None


async def waiting(redis: Any, partition: Partition, saga_ids: Sequence[str], now_ms: int) -> set[str]:
    """The sagas of ``saga_ids`` (suspended ones) that wait within their wait's deadline.

    A wait's deadline is its timer (a sleep's end, a signal's or event's timeout): still
    ahead, the saga waits as designed; no timer, it waits as long as it takes. A timer past
    due (not fired) or gone (fired, its event not decided) means nothing moved it: stuck.
    """
    if not saga_ids:
        return set()
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            for saga_id in saga_ids:
                pipe.hget(partition.saga(saga_id), "meta")
            metas = await pipe.execute()
    waits = {
        saga_id: meta.wait
        for saga_id, raw in zip(saga_ids, metas, strict=True)
        if raw is not None and (meta := decode_meta(raw)).wait is not None
    }
    if not waits:
        return set()
    with redis_errors():
        async with redis.pipeline(transaction=False) as pipe:
            for saga_id, wait in waits.items():
                pipe.hget(partition.saga(saga_id), f"s:{wait.step}")
            steps = await pipe.execute()
    timers = {
        saga_id: decode_timer(saga_id, waits[saga_id].step, raw) if raw is not None else None
        for saga_id, raw in zip(waits, steps, strict=True)
    }
    timed = [(saga_id, timer) for saga_id, timer in timers.items() if timer is not None]
    with redis_errors():
        due = await redis.zmscore(partition.timers, [t for _, t in timed]) if timed else []
    found = {saga_id for saga_id, timer in timers.items() if timer is None}
    found |= {
        saga_id
        for (saga_id, _), score in zip(timed, due, strict=True)
        if score is not None and score > now_ms
    }
    return found


@dataclass(slots=True)
class Walk:
    """One walk over the index entries matching a query; counts the waiting sagas it left out."""

    query: Query
    waiting: int = 0

    async def rows(self, redis: Any, partitions: Sequence[Partition], now_ms: int) -> Any:
        """The matching rows, in index order (an async iterator)."""
        async for found in _batches(redis, partitions, self.query, now_ms):
            batch = (
                found
                if self.query.stuck_for_ms is None
                else await self._without_waiting(redis, found, now_ms)
            )
            for row in batch:
                if self.query.accepts(row):
                    yield row

    async def _without_waiting(self, redis: Any, batch: list[SagaRow], now_ms: int) -> list[SagaRow]:
        left_out: set[tuple[str, int, str]] = set()
        by_partition: dict[tuple[str, int], list[str]] = {}
        for row in batch:
            if row.status == SagaStatus.SUSPENDED:
                by_partition.setdefault((row.context, row.partition), []).append(row.id)
        for (context, index), ids in by_partition.items():
            left_out |= {
                (context, index, i) for i in await waiting(redis, Partition(context, index), ids, now_ms)
            }
        kept = [r for r in batch if (r.context, r.partition, r.id) not in left_out]
        self.waiting += sum(
            1 for r in batch if (r.context, r.partition, r.id) in left_out and self.query.accepts(r)
        )
        return kept


async def _batches(redis: Any, partitions: Sequence[Partition], query: Query, now_ms: int) -> Any:
    low, high = query.score_range(now_ms)
    indexes = [_Index(key, p, low, high, query.newest_first) for p in partitions for key in query.keys(p)]
    sign = -1.0 if query.newest_first else 1.0  # the heap pops the smallest: newest first negates
    heap: list[tuple[float, str, int]] = []
    for n, index in enumerate(indexes):
        await index.fill(redis)
        if index.buffer:
            score, member = index.buffer.pop()
            heapq.heappush(heap, (sign * score, member, n))
    while heap:
        batch: list[tuple[float, str, int]] = []
        while heap and len(batch) < _WINDOW:
            score, member, n = heapq.heappop(heap)
            batch.append((score, member, n))
            index = indexes[n]
            await index.fill(redis)
            if index.buffer:
                next_score, next_member = index.buffer.pop()
                heapq.heappush(heap, (sign * next_score, next_member, n))
        yield await _rows(redis, [(sign * s, m, indexes[n].partition) for s, m, n in batch], now_ms)


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
                created_ms=int(values[5] or 0),
            )
        )
    return rows


async def count_idle(
    redis: Any, partitions: Sequence[Partition], *, now_ms: int, idle_ms: int
) -> tuple[int, int]:
    """``(stuck, waiting)``: sagas not moved for ``idle_ms``, split by :func:`waiting`.

    Counts each unfinished status's index up to the cutoff; only the suspended sagas are
    read, in windows, to tell the waiting ones apart.
    """
    stuck = held = 0
    cutoff = now_ms - idle_ms
    for partition in partitions:
        with redis_errors():
            async with redis.pipeline(transaction=False) as pipe:
                for status in _MOVING:
                    pipe.zcount(partition.by_status(status.value), "-inf", cutoff)
                stuck += sum(await pipe.execute())
        start = 0
        while True:
            with redis_errors():
                ids = await redis.zrangebyscore(
                    partition.by_status(SagaStatus.SUSPENDED.value), "-inf", cutoff, start=start, num=_WINDOW
                )
            members = [m.decode() for m in ids]
            waits = len(await waiting(redis, partition, members, now_ms))
            held += waits
            stuck += len(members) - waits
            start += len(members)
            if len(members) < _WINDOW:
                break
    return stuck, held
