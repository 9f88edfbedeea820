"""Client calls ride through Redis being unavailable, up to their deadline, on an injected clock."""

from __future__ import annotations

import pytest
from redis import exceptions as rx

import bus
from bus.lowlevel import RideThrough, rides_through

pytestmark = pytest.mark.anyio


class SteppingClock(bus.FakeClock):
    """A fake clock whose sleeps pass at once, moving the time on by what was slept."""

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)


class Flaky:
    """Fails with ``error`` ``failures`` times, then answers ``"ok"``."""

    def __init__(self, failures: int, error: Exception, deadline_s: float = 30) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0
        self.clock = SteppingClock()
        self.ride_through = RideThrough(self.clock, deadline_s)

    @rides_through
    async def call(self, value: str = "ok") -> str:
        """Answer ``value`` once the failures are used up."""
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return value

    @rides_through
    async def outer(self) -> str:
        """A call that rides through, making another one."""
        return await self.call()


@pytest.mark.parametrize(
    "error",
    [
        bus.RedisUnavailable("Redis unavailable: the cluster is down"),
        rx.ClusterDownError("The cluster is down"),
        rx.TryAgainError("TRYAGAIN"),
        rx.ClusterError("TTL exhausted."),  # redirected too often while a slot moved
        rx.ConnectionError("Connection refused"),
        rx.ReadOnlyError("You can't write against a read only replica."),
    ],
)
async def test_a_call_is_retried_while_redis_is_unavailable(error: Exception) -> None:
    flaky = Flaky(5, error)
    assert await flaky.call("answer") == "answer"
    assert flaky.calls == 6


async def test_past_the_deadline_the_error_is_raised() -> None:
    flaky = Flaky(10**6, bus.RedisUnavailable("down"), deadline_s=15)
    with pytest.raises(bus.RedisUnavailable):
        await flaky.call()
    elapsed_s = (flaky.clock.now_ms() - bus.FakeClock().now_ms()) / 1000
    assert 15 <= elapsed_s < 17  # the last back-off is at most a second
    assert flaky.calls > 10


async def test_a_zero_deadline_runs_the_call_once() -> None:
    flaky = Flaky(1, bus.RedisUnavailable("down"), deadline_s=0)
    with pytest.raises(bus.RedisUnavailable):
        await flaky.call()
    assert flaky.calls == 1


@pytest.mark.parametrize(
    "error",
    [
        bus.RedisPermissionDenied("NOPERM"),
        rx.ResponseError("ERR wrong number of arguments"),
        ValueError("bug"),
    ],
)
async def test_other_errors_are_raised_at_once(error: Exception) -> None:
    flaky = Flaky(1, error)
    with pytest.raises(type(error)):
        await flaky.call()
    assert flaky.calls == 1


async def test_a_call_inside_another_runs_once_under_the_outer_deadline() -> None:
    flaky = Flaky(3, bus.RedisUnavailable("down"))
    assert await flaky.outer() == "ok"
    assert flaky.calls == 4  # the inner call failed three times: the outer one repeated it


def test_a_negative_deadline_is_refused() -> None:
    with pytest.raises(ValueError, match="deadline"):
        RideThrough(bus.FakeClock(), -1)
