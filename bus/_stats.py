"""Queue-depth figures per stream and group (for ``saga stats``, metrics and autoscalers)."""

from __future__ import annotations

import msgspec

from bus._client import Redis
from bus._errors import redis_errors
from redsaga.streams import Stream


class GroupStats(msgspec.Struct, frozen=True, kw_only=True):
    """One consumer group's backlog.

    Attributes:
        group: The group's name.
        consumers: Consumers registered in the group.
        pending: Entries delivered and not yet acknowledged.
        lag: Entries not yet delivered to the group (``None`` when Redis cannot tell,
            after deletions in the stream).
        oldest_pending_id: The oldest unacknowledged entry, if any.
        oldest_pending_age_ms: How long ago that entry was added, by the Redis clock.

    """

    group: str
    consumers: int
    pending: int
    lag: int | None
    oldest_pending_id: str | None
    oldest_pending_age_ms: int | None


class StreamStats(msgspec.Struct, frozen=True, kw_only=True):
    """A stream's length, its groups' backlogs and its tag's dead-letter count."""

    stream: str
    length: int
    dead_letters: int
    groups: list[GroupStats]


async def stream_stats(redis: Redis, stream: Stream) -> StreamStats:
    """Read the figures of ``stream`` from XINFO/XPENDING (a handful of commands, no scan)."""
    with redis_errors():
        seconds, micros = await redis.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        length = int(await redis.xlen(stream.key))
        dead = int(await redis.xlen(stream.dlq_key))
        infos = await redis.xinfo_groups(stream.key) if length or await redis.exists(stream.key) else []
        groups = []
        for info in infos:
            name = _text(info["name"])
            summary = await redis.xpending(stream.key, name)
            oldest = _text(summary["min"]) if summary["pending"] else None
            groups.append(
                GroupStats(
                    group=name,
                    consumers=int(info["consumers"]),
                    pending=int(info["pending"]),
                    lag=None if info.get("lag") is None else int(info["lag"]),
                    oldest_pending_id=oldest,
                    oldest_pending_age_ms=now_ms - int(oldest.split("-")[0]) if oldest else None,
                )
            )
    return StreamStats(stream=stream.key, length=length, dead_letters=dead, groups=groups)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
