"""Rate limits' buckets in Redis: take and give back tokens, change a limit, read it.

Each limit lives under its own hash tag (``rs:{limit:<name>}``, :class:`~saga.store.keys.LimitKeys`),
so the one bucket every worker of every context shares is one single-slot script on a Redis
Cluster, whatever partition the saga taking a token lives in. A take and the transition
that sends (or holds) the command are two scripts in two slots: a take is recorded under the
command id, so a transition that must be decided again takes nothing twice, and a token
taken for a transition that never commits is given back (or, after a crash between the two,
lost: the rate stays below its limit, never above). See ``saga/store/lua/rate_take.lua``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from bus.lowlevel import ScriptCall, redis_errors, run_batch
from saga.definition.rate import RateLimit
from saga.store.keys import LIMIT_NAMES, LimitKeys
from saga.store.scripts import RATE_SET, RATE_TAKE


class LimitChange(msgspec.Struct, frozen=True, kw_only=True):
    """One operator change of a limit, as recorded (``saga limits list --json``'s ``changes``)."""

    id: str
    at: int
    """When (Unix ms, the Redis clock)."""
    by: str
    """Who (the operator's name)."""
    old: dict[str, float | None]
    """``{"rate": per second, "burst": n}`` before (``None``: not known)."""
    new: dict[str, float]
    """``{"rate": per second, "burst": n}`` after."""


class LimitView(msgspec.Struct, frozen=True, kw_only=True):
    """A limit as ``saga limits list`` shows it."""

    name: str
    rate: float | None
    """Commands per second in force (the operator's, else the declared one; ``None``: unknown)."""
    burst: int | None
    tokens: float | None
    """Tokens in the bucket at its last use (below zero: commands waiting for a promised token)."""
    declared: bool
    """Whether the app given declares it."""
    set_by_operator: bool
    changes: list[LimitChange]
    """The operator's changes, newest first (at most 100)."""


def take_call(limit: RateLimit, command_id: str, *, now_ms: int, release: bool = False) -> ScriptCall:
    """The call taking (or giving back) ``limit``'s token for ``command_id``.

    ``now_ms`` is the injected clock's time, or -1 for the Redis clock. A take returns
    ``[when the command may go, now]`` (ms); a release 1 when a token went back.
    """
    mode = "release" if release else "take"
    args = (now_ms, repr(limit.per_second), limit.burst, command_id, mode)
    return RATE_TAKE.call(LimitKeys(limit.name).all()[:2], args)


async def run_calls(redis: Any, calls: Sequence[ScriptCall]) -> list[Any]:
    """Run take or release calls in one pipelined batch; errors are returned in place."""
    return await run_batch(redis, calls)


async def set_limit(
    redis: Any,
    name: str,
    *,
    rate: float | None,
    burst: int | None,
    declared: RateLimit | None,
    by: str,
    change_id: str,
    now_ms: int = -1,
) -> LimitChange:
    """Change limit ``name`` for every worker and record who changed it (``saga limits set``)."""
    keys = LimitKeys(name)
    args = (
        now_ms,
        "" if rate is None else repr(rate),
        "" if burst is None else burst,
        "" if declared is None else repr(declared.per_second),
        "" if declared is None else declared.burst,
        by,
        change_id,
    )
    raw = await RATE_SET(redis, [keys.bucket, keys.log], args)
    with redis_errors():
        await redis.sadd(LIMIT_NAMES, name)
    return msgspec.json.decode(raw, type=LimitChange)


async def register(redis: Any, limits: Sequence[RateLimit]) -> None:
    """Record the names of the limits a worker declares, for ``saga limits list``."""
    if limits:
        with redis_errors():
            await redis.sadd(LIMIT_NAMES, *(limit.name for limit in limits))


async def read_limits(redis: Any, declared: Sequence[RateLimit] = ()) -> list[LimitView]:
    """Every limit recorded in Redis or in ``declared``, with its bucket and changes, by name."""
    by_name = {limit.name: limit for limit in declared}
    with redis_errors():
        names = {n.decode() for n in await redis.smembers(LIMIT_NAMES)} | set(by_name)
        views = []
        for name in sorted(names):
            keys = LimitKeys(name)
            async with redis.pipeline(transaction=False) as pipe:
                pipe.hmget(keys.bucket, "tokens", "rate", "burst")
                pipe.lrange(keys.log, 0, 99)
                (tokens, rate, burst), log = await pipe.execute()
            limit = by_name.get(name)
            views.append(
                LimitView(
                    name=name,
                    rate=float(rate) if rate is not None else (limit.per_second if limit else None),
                    burst=int(burst) if burst is not None else (limit.burst if limit else None),
                    tokens=None if tokens is None else round(float(tokens), 3),
                    declared=limit is not None,
                    set_by_operator=rate is not None,
                    changes=[msgspec.json.decode(entry, type=LimitChange) for entry in log],
                )
            )
    return views
