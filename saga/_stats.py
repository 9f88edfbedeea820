"""What ``saga stats`` reports: saga counts, queue depths, dead letters, stuck sagas, outboxes.

Sagas are counted per definition, version and status. Every figure comes from a counter,
an index or XINFO/XPENDING (a handful of commands per stream), so it is cheap enough to
scrape for metrics and autoscaling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from bus import StreamStats, dead_letter_sizes, stream_stats
from bus._errors import redis_errors
from bus._keys import Stream
from saga._keys import Partition
from saga._states import SagaStatus


class SagaCount(msgspec.Struct, kw_only=True):
    """How many sagas of one definition version are in one status."""

    definition: str
    version: int
    status: SagaStatus
    count: int


class OutboxBacklog(msgspec.Struct, kw_only=True):
    """One outbox database's backlog (``error`` says why it could not be read)."""

    dsn: str
    backlog: int | None = None
    oldest_unsent_age_ms: int | None = None
    failed: int | None = None
    error: str = ""


class Stats(msgspec.Struct, kw_only=True):
    """Everything ``saga stats`` prints.

    Attributes:
        checked_at_ms: When the figures were read.
        sagas: Sagas per definition, version and status (ended ones included; they stay
            counted after their state expires).
        in_flight: Sagas not ended (running, suspended, compensating, dead-lettered).
        stuck: Sagas that have not moved for ``stuck_for_ms``.
        stuck_for_ms: The threshold for ``stuck``.
        streams: Length, and per consumer group pending, lag and oldest-pending age.
        dead_letters: Letters per dead-letter stream.
        outbox: The backlog of each outbox database asked about.

    """

    checked_at_ms: int
    sagas: list[SagaCount]
    in_flight: int
    stuck: int
    stuck_for_ms: int
    streams: list[StreamStats]
    dead_letters: dict[str, int]
    outbox: list[OutboxBacklog]


async def saga_counts(redis: Any, partitions: Sequence[Partition]) -> list[SagaCount]:
    """The counters of every partition, summed (zero rows left out)."""
    totals: dict[tuple[str, int, str], int] = {}
    with redis_errors():
        for partition in partitions:
            for key, value in (await redis.hgetall(partition.counts)).items():
                definition, _, status = key.decode().rpartition("|")
                name, _, version = definition.rpartition("@")
                slot = (name, int(version), status)
                totals[slot] = totals.get(slot, 0) + int(value)
    return [
        SagaCount(definition=name, version=version, status=SagaStatus(status), count=count)
        for (name, version, status), count in sorted(totals.items())
        if count
    ]


async def gather(
    redis: Any,
    partitions: Sequence[Partition],
    streams: Sequence[Stream],
    *,
    now_ms: int,
    stuck_for_ms: int,
    dsns: Sequence[str] = (),
) -> Stats:
    """Read every figure for ``partitions`` and ``streams`` (and the outboxes at ``dsns``)."""
    counts = await saga_counts(redis, partitions)
    stuck = 0
    with redis_errors():
        for partition in partitions:
            stuck += int(await redis.zcount(partition.active, "-inf", now_ms - stuck_for_ms))
    return Stats(
        checked_at_ms=now_ms,
        sagas=counts,
        in_flight=sum(c.count for c in counts if not c.status.terminal),
        stuck=stuck,
        stuck_for_ms=stuck_for_ms,
        streams=[await stream_stats(redis, stream) for stream in streams],
        dead_letters=await dead_letter_sizes(redis, sorted({s.dlq_key for s in streams})),
        outbox=[await _outbox(dsn, now_ms) for dsn in dsns],
    )


async def _outbox(dsn: str, now_ms: int) -> OutboxBacklog:
    import relay  # noqa: PLC0415 - only when an outbox is asked about

    try:
        stats = await relay.outbox_stats(dsn, now_ms=now_ms)
    except relay.RelayError as error:
        return OutboxBacklog(dsn=relay.redact(dsn), error=str(error))
    return OutboxBacklog(
        dsn=relay.redact(dsn),
        backlog=stats.backlog,
        oldest_unsent_age_ms=stats.oldest_unsent_age_ms,
        failed=stats.failed,
    )
