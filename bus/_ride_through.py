"""Client calls that ride through a failover: retried while Redis is unavailable, up to a deadline.

A Redis Cluster failover leaves a slot without a master for ``cluster-node-timeout`` and a
little more (``CLUSTERDOWN``, ``TRYAGAIN``, refused connections, ``READONLY`` from a
replica being promoted); a single server's restart looks alike. Workers wait that out in
their loops. A client call (start a saga, read one, complete a task) would otherwise fail
in those seconds: :class:`RideThrough` retries it with jittered back-off while the error is
:class:`~bus.RedisUnavailable`, and raises that error only once the deadline has passed.

Only calls that are safe to repeat ride through: the caller decorates those with
:func:`rides_through` (a start keeps its saga id across the repeats, so a start that landed
before its reply was lost is found, not made twice). A call inside another that rides
through already runs once: the outer one owns the deadline.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from redis import exceptions as rx

from bus._backoff import Backoff
from bus._clock import Clock
from bus._errors import RedisUnavailable, translate
from bus._log import get_logger

T = TypeVar("T")
P = ParamSpec("P")

_log = get_logger("bus.ride_through")
_RIDING: ContextVar[bool] = ContextVar("redsaga_riding_through", default=False)


class RideThrough:
    """Runs an operation again while Redis is unavailable, for up to ``deadline_s`` on ``clock``.

    ``deadline_s`` 0 runs it once. The back-off grows to ``cap_s`` between attempts.
    """

    def __init__(self, clock: Clock, deadline_s: float, *, cap_s: float = 1.0) -> None:
        if deadline_s < 0:
            raise ValueError("a ride-through deadline is 0 (no retries) or more seconds")
        self.clock = clock
        self.deadline_s = deadline_s
        self.cap_s = cap_s

    async def __call__(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation()``'s result, retried while it raises :class:`RedisUnavailable`."""
        if _RIDING.get():
            return await operation()
        token = _RIDING.set(True)
        try:
            return await self._ride(what, operation)
        finally:
            _RIDING.reset(token)

    async def _ride(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        give_up_ms = self.clock.now_ms() + int(self.deadline_s * 1000)
        backoff = Backoff(self.clock, cap_s=self.cap_s)
        attempts = 0
        while True:
            attempts += 1
            try:
                result = await operation()
            except (RedisUnavailable, rx.RedisError, rx.RedisClusterException) as error:
                unavailable = error if isinstance(error, RedisUnavailable) else translate(error)
                if not isinstance(unavailable, RedisUnavailable) or self.clock.now_ms() >= give_up_ms:
                    raise
                if attempts == 1:
                    _log.warning(
                        "redis_unavailable_retrying", call=what, deadline_s=self.deadline_s, error=str(error)
                    )
                await backoff.wait()
                continue
            if attempts > 1:
                _log.info("redis_available_again", call=what, attempts=attempts)
            return result


class Riding(Protocol):
    """An object whose calls ride through: it holds the :class:`RideThrough` they use."""

    ride_through: RideThrough


R = TypeVar("R", bound=Riding)


def rides_through(
    method: Callable[Concatenate[R, P], Awaitable[T]],
) -> Callable[Concatenate[R, P], Coroutine[Any, Any, T]]:
    """Make ``method`` (safe to repeat) retry under its object's ``ride_through``."""

    async def riding(self: R, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.ride_through(method.__qualname__, lambda: method(self, *args, **kwargs))

    functools.update_wrapper(riding, method)
    return riding
