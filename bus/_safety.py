"""The start-up check of Redis settings that silently lose saga data (docs/faults.md, item 13).

- ``maxmemory-policy`` other than ``noeviction``: at ``maxmemory`` Redis deletes keys on its
  own: a saga's state, a pending stream, a group's dedupe records (and with them the
  exactly-once effect). Every such policy, ``volatile-*`` included (ended sagas carry a
  TTL), is unsafe. ``BusConfig.on_eviction`` decides: ``refuse`` (the default) raises
  :class:`~bus.UnsafeRedisConfig`, ``warn`` logs an error and starts, ``ignore`` is silent.
- ``appendonly no``: a crash loses everything since the last snapshot (or everything, with
  none). ``BusConfig.on_no_aof``, default ``warn``: many teams run a cache-grade Redis in
  development, and a replica with AOF may hold the durable copy.

The settings are read from ``INFO`` (``maxmemory_policy``, ``aof_enabled``), not ``CONFIG
GET``: ACL users need not be granted ``CONFIG``, which would also show them the server's
passwords. A server that refuses ``INFO`` cannot be checked: the worker logs a warning that
says so and starts.
"""

from __future__ import annotations

from typing import Any

from bus._client import Redis, is_embedded
from bus._cluster import is_cluster, primaries
from bus._config import BusConfig
from bus._errors import RedisCommandError, UnsafeRedisConfig, redis_errors
from bus._log import get_logger

_log = get_logger("redsaga.bus")


async def check_redis_settings(redis: Redis, config: BusConfig) -> list[str]:
    """Check the server's settings (every master's, on a cluster); return the problems found.

    Raises :class:`UnsafeRedisConfig` on a problem the config refuses.
    """
    if is_embedded(redis):
        return []
    try:
        with redis_errors():
            every = await _settings_of_every_master(redis)
    except RedisCommandError as error:  # NOPERM, or INFO renamed away by a managed service
        _log.warning(
            "could not check the Redis settings that protect saga data (INFO refused); "
            "make sure maxmemory-policy is noeviction and AOF is on",
            error=str(error),
        )
        return []
    found: list[tuple[str, str]] = []
    for settings in every:  # each problem once, however many masters have it
        found += [problem for problem in _problems(settings, config) if problem not in found]
    refused = [problem for problem, mode in found if mode == "refuse"]
    if refused:
        raise UnsafeRedisConfig(refused)
    warned = [problem for problem, mode in found if mode == "warn"]
    for problem in warned:
        _log.error("unsafe Redis configuration", problem=problem)
    return warned


async def _settings_of_every_master(redis: Redis) -> list[dict[str, Any]]:
    """``INFO memory`` and ``persistence`` of the server, or of each master of a cluster."""
    if not is_cluster(redis):
        return [{**await redis.info("memory"), **await redis.info("persistence")}]
    every = []
    for node in await primaries(redis):
        memory = await redis.info("memory", target_nodes=node)
        every.append({**memory, **await redis.info("persistence", target_nodes=node)})
    return every


def _problems(settings: dict[str, Any], config: BusConfig) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    policy = _text(settings.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        evicts = f"maxmemory-policy is {policy}: at maxmemory Redis deletes saga state, pending entries "
        found.append((evicts + "and dedupe keys; set it to noeviction", config.on_eviction))
    if _text(settings.get("aof_enabled", 1)) != "1":
        no_aof = "appendonly is no: a Redis crash loses every transition since the last snapshot; "
        found.append((no_aof + "turn AOF on (appendfsync everysec or always)", config.on_no_aof))
    return found


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
