"""What ``saga stats`` reports: saga counts, queue depths, dead letters, stuck sagas, outboxes.

Sagas are counted per definition, version and status. Every figure comes from a counter,
an index or XINFO/XPENDING (a handful of commands per stream), so it is cheap enough to
scrape for metrics and autoscaling; telling stuck sagas from waiting ones reads the
suspended ones among those idle past the threshold (``saga/ops/listing.py``).

A consumer is *live* when ``XINFO CONSUMERS`` reports it idle (no read, claim or heartbeat
in its group) for less than the lease (``BusConfig.lease_ms``): a worker reads every
``block_ms`` and heartbeats its entries every third of the lease, and past the lease the
bus itself hands a silent consumer's entries to another. Groups still list stopped or
crashed workers' consumers until worker maintenance deletes them (``consumer_idle_ms``);
those count as idle, not live.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import msgspec

from bus import StreamStats, dead_letter_sizes, stream_stats
from bus.lowlevel import is_cluster, owner_of, primaries, redis_errors, slot_of
from redsaga.streams import Stream
from saga.core.states import SagaStatus
from saga.ops.listing import count_idle
from saga.store.keys import Partition


class SagaCount(msgspec.Struct, kw_only=True):
    """How many sagas of one definition version are in one status."""

    definition: str
    version: int
    status: SagaStatus
    count: int


class SagaTally(msgspec.Struct, kw_only=True):
    """How many sagas a listing matches over all its pages, per definition, version and status.

    Attributes:
        total: Every matching saga.
        counts: The same, per definition, version and status (zero rows left out).
        stuck_for_ms: Only sagas not moved for this long were counted (``None``: all).
        waiting: With ``stuck_for_ms``, how many sagas idle that long were left out because
            they wait within their wait's deadline (``None`` otherwise).

    """

    total: int
    counts: list[SagaCount]
    stuck_for_ms: int | None = None
    waiting: int | None = None


class OutboxBacklog(msgspec.Struct, kw_only=True):
    """One outbox database's backlog (``error`` says why it could not be read)."""

    dsn: str
    backlog: int | None = None
    oldest_unsent_age_ms: int | None = None
    failed: int | None = None
    error: str = ""


class GroupLoad(msgspec.Struct, frozen=True, kw_only=True):
    """One consumer group's consumers and backlog.

    Attributes:
        group: The group's name.
        consumers: Live consumers (see the module docstring).
        idle_consumers: Consumers the group lists that are not live.
        pending: Entries delivered and not yet acknowledged.
        lag: Entries not yet delivered to the group (``None`` when Redis cannot tell).
        oldest_pending_id: The oldest unacknowledged entry, if any.
        oldest_pending_age_ms: How long ago that entry was added, by the Redis clock.

    """

    group: str
    consumers: int
    idle_consumers: int
    pending: int
    lag: int | None
    oldest_pending_id: str | None
    oldest_pending_age_ms: int | None


class StreamLoad(msgspec.Struct, frozen=True, kw_only=True):
    """A stream's length, its groups (live consumers, backlog) and its tag's dead letters."""

    stream: str
    length: int
    dead_letters: int
    groups: list[GroupLoad]


class NodeLoad(msgspec.Struct, frozen=True, kw_only=True):
    """One master of a Redis Cluster: the partitions and streams it serves, its keys and memory."""

    node: str
    """``host:port``."""
    partitions: int
    streams: int
    keys: int
    used_memory_bytes: int


class Stats(msgspec.Struct, kw_only=True):
    """Everything ``saga stats`` prints.

    Attributes:
        checked_at_ms: When the figures were read.
        sagas: Sagas per definition, version and status (ended ones included; they stay
            counted after their state expires).
        in_flight: Sagas not ended (running, suspended, compensating, dead-lettered).
        stuck: Sagas that have not moved for ``stuck_for_ms``, waiting ones left out.
        waiting: Sagas not moved for ``stuck_for_ms`` that wait within their wait's
            deadline (a sleep, signal or event wait whose timer is still ahead, or that has
            no timeout): not stuck.
        stuck_for_ms: The threshold for ``stuck``.
        live_after_ms: A consumer idle for less than this is live (the lease).
        streams: Length, and per consumer group live consumers, pending, lag and
            oldest-pending age.
        dead_letters: Letters per dead-letter stream.
        outbox: The backlog of each outbox database asked about.
        nodes: On a Redis Cluster, the load of each master (empty on a single server).

    """

    checked_at_ms: int
    sagas: list[SagaCount]
    in_flight: int
    stuck: int
    waiting: int
    stuck_for_ms: int
    live_after_ms: int
    streams: list[StreamLoad]
    dead_letters: dict[str, int]
    outbox: list[OutboxBacklog]
    nodes: list[NodeLoad] = msgspec.field(default_factory=list)


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
    live_after_ms: int,
    dsns: Sequence[str] = (),
) -> Stats:
    """Read every figure for ``partitions`` and ``streams`` (and the outboxes at ``dsns``).

    ``live_after_ms``: a consumer idle for less than this is live (pass the lease).
    """
    counts = await saga_counts(redis, partitions)
    stuck, waiting = await count_idle(redis, partitions, now_ms=now_ms, idle_ms=stuck_for_ms)
    return Stats(
        checked_at_ms=now_ms,
        sagas=counts,
        in_flight=sum(c.count for c in counts if not c.status.terminal),
        stuck=stuck,
        waiting=waiting,
        stuck_for_ms=stuck_for_ms,
        live_after_ms=live_after_ms,
        streams=[await _load(redis, await stream_stats(redis, s), live_after_ms) for s in streams],
        dead_letters=await dead_letter_sizes(redis, sorted({s.dlq_key for s in streams})),
        outbox=[await _outbox(dsn, now_ms) for dsn in dsns],
        nodes=await node_loads(redis, partitions, streams),
    )


async def node_loads(
    redis: Any, partitions: Sequence[Partition], streams: Sequence[Stream]
) -> list[NodeLoad]:
    """Per master of a cluster: partitions and streams by the slot of their tag, keys, memory.

    Empty on a single server. Uneven partitions per master are what ``saga.ops.placement``
    plans slot moves for.
    """
    if not is_cluster(redis):
        return []
    with redis_errors():
        masters = await primaries(redis)
        by_partition = Counter(owner_of(redis, slot_of(p.inbox.key)) for p in partitions)
        by_stream = Counter(owner_of(redis, slot_of(s.key)) for s in streams)
        loads = []
        for node in masters:
            memory = await redis.info("memory", target_nodes=node)
            loads.append(
                NodeLoad(
                    node=node.name,
                    partitions=by_partition[node.name],
                    streams=by_stream[node.name],
                    keys=int(await redis.dbsize(target_nodes=node)),
                    used_memory_bytes=int(memory["used_memory"]),
                )
            )
    return sorted(loads, key=lambda load: load.node)


async def _load(redis: Any, stats: StreamStats, live_after_ms: int) -> StreamLoad:
    """``stats`` with each group's consumers split into live and idle (``XINFO CONSUMERS``)."""
    groups = []
    for group in stats.groups:
        with redis_errors():
            consumers = await redis.xinfo_consumers(stats.stream, group.group)
        live = sum(1 for c in consumers if int(c["idle"]) < live_after_ms)
        groups.append(
            GroupLoad(
                group=group.group,
                consumers=live,
                idle_consumers=len(consumers) - live,
                pending=group.pending,
                lag=group.lag,
                oldest_pending_id=group.oldest_pending_id,
                oldest_pending_age_ms=group.oldest_pending_age_ms,
            )
        )
    return StreamLoad(
        stream=stats.stream, length=stats.length, dead_letters=stats.dead_letters, groups=groups
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
