"""Housekeeping: safe trimming of acknowledged entries and removal of idle, empty consumers."""

from __future__ import annotations

from bus._app import Subscription
from bus._client import Redis
from bus._config import BusConfig
from bus._errors import redis_errors
from bus._log import get_logger
from bus._lua import DELETE_CONSUMER, TRIM

_log = get_logger("redsaga.bus")


async def trim_stream(redis: Redis, stream_key: str, retention_ms: int) -> int:
    """Trim entries older than ``retention_ms`` that every group has acknowledged; return how many."""
    return int(await TRIM(redis, [stream_key], [retention_ms]))


async def delete_idle_consumers(
    redis: Redis, subscription: Subscription, *, idle_ms: int, keep: str
) -> list[str]:
    """Delete consumers of the group idle for ``idle_ms`` that hold nothing pending.

    A consumer that still holds entries is kept: deleting it would drop them (docs/faults.md).
    """
    key = subscription.stream.key
    with redis_errors():
        consumers = await redis.xinfo_consumers(key, subscription.group)
    deleted = []
    for info in consumers:
        name = info["name"].decode() if isinstance(info["name"], bytes) else str(info["name"])
        if name == keep or int(info["pending"]) or int(info["idle"]) < idle_ms:
            continue
        if await DELETE_CONSUMER(redis, [key], [subscription.group, name]):
            deleted.append(name)
    if deleted:
        _log.info("deleted idle consumers", stream=key, group=subscription.group, consumers=deleted)
    return deleted


async def run_maintenance(
    redis: Redis, subscriptions: list[Subscription], config: BusConfig, *, consumer: str
) -> None:
    """One round of housekeeping over every subscribed stream."""
    if config.retention_ms is not None:
        for key in sorted({s.stream.key for s in subscriptions}):
            trimmed = await trim_stream(redis, key, config.retention_ms)
            if trimmed:
                _log.info("trimmed acknowledged entries", stream=key, entries=trimmed)
    for subscription in subscriptions:
        await delete_idle_consumers(redis, subscription, idle_ms=config.consumer_idle_ms, keep=consumer)
