"""The fault proxy itself: each mode, observed with a plain redis-py client on real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import bus
from tests.faults.proxy import FaultProxy, Mode, ThreadedProxy

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]


@pytest.fixture
async def proxy(real_redis: bus.Redis, real_redis_url: str) -> AsyncIterator[FaultProxy]:
    async with FaultProxy.to_url(real_redis_url) as running:
        yield running


def plain_client(url: str, *, timeout: float = 2.0) -> redis.asyncio.Redis:
    """A plain redis-py client that never re-sends a command."""
    return redis.asyncio.Redis.from_url(url, socket_timeout=timeout, retry=Retry(NoBackoff(), 0))


def retrying_client(url: str) -> bus.Redis:
    """redsaga's client, which re-sends a command up to 3 times after a connection error."""
    return bus.connect(url, bus.ClientConfig(retries=3))


async def test_pass_forwards_both_ways_and_counts(proxy: FaultProxy, real_redis_url: str) -> None:
    async with plain_client(proxy.url(real_redis_url)) as client:
        await client.set("k", "v")
        assert await client.get("k") == b"v"
    assert proxy.counters.connections == 1
    assert proxy.counters.bytes_up > 0
    assert proxy.counters.bytes_down > 0


async def test_delay_holds_replies_back(proxy: FaultProxy, real_redis_url: str) -> None:
    proxy.set_mode(Mode.DELAY, delay_s=1.0, jitter_s=0.5)
    async with plain_client(proxy.url(real_redis_url), timeout=0.1) as client:
        with pytest.raises(redis.TimeoutError):
            await client.ping()
    proxy.set_mode(Mode.DELAY, delay_s=0.001, jitter_s=0.002)
    async with plain_client(proxy.url(real_redis_url)) as client:
        assert await client.ping()


async def test_blackhole_forwards_nothing_until_healed(
    proxy: FaultProxy, real_redis: bus.Redis, real_redis_url: str
) -> None:
    async with plain_client(proxy.url(real_redis_url), timeout=0.2) as client:
        assert await client.ping()
        proxy.set_mode(Mode.BLACKHOLE)
        with pytest.raises(redis.TimeoutError):
            await client.set("k", "v")
        assert await real_redis.get("k") is None  # the server never saw it
        assert proxy.counters.dropped_bytes > 0
        proxy.set_mode(Mode.PASS)
        await client.set("k", "v")  # redis-py reconnects: a fresh link
    assert await real_redis.get("k") == b"v"


async def test_reset_sends_rst_on_open_and_new_connections(proxy: FaultProxy, real_redis_url: str) -> None:
    async with plain_client(proxy.url(real_redis_url)) as client:
        assert await client.ping()
        proxy.set_mode(Mode.RESET)
        with pytest.raises(redis.ConnectionError):
            await client.ping()
        assert proxy.counters.resets >= 1
        proxy.set_mode(Mode.PASS)
        assert await client.ping()


async def test_swallow_reply_is_the_ambiguous_write(
    proxy: FaultProxy, real_redis: bus.Redis, real_redis_url: str
) -> None:
    """The server runs the command, the client sees a connection error; a retry runs it again."""
    url = proxy.url(real_redis_url)
    proxy.set_mode(Mode.SWALLOW_REPLY, match=b"INCR")  # not the connection's handshake
    async with plain_client(url) as client:
        with pytest.raises(redis.ConnectionError):
            await client.incr("n")
    assert await real_redis.get("n") == b"1"
    async with retrying_client(url) as client:
        with pytest.raises(redis.ConnectionError):
            await client.incr("n")
    assert await real_redis.get("n") == b"5"  # docs/faults.md: one INCR ran once per attempt
    proxy.set_mode(Mode.SWALLOW_REPLY, match=b"INCR", times=1)
    async with retrying_client(url) as client:
        assert await client.set("other", 1)  # not matched: passes
        assert await client.incr("n") == 7  # swallowed once, re-sent once: ran twice
    assert proxy.mode == Mode.PASS
    assert proxy.counters.swallowed == 1 + 4 + 1


def test_threaded_proxy_serves_synchronous_clients(real_redis_url: str) -> None:
    target = FaultProxy.to_url(real_redis_url)
    with ThreadedProxy(*target.target) as threaded:
        client = redis.Redis.from_url(threaded.proxy.url(real_redis_url), socket_timeout=0.2, retry=None)
        assert client.ping()
        threaded.set_mode(Mode.BLACKHOLE)
        with pytest.raises(redis.TimeoutError):
            client.ping()
        threaded.set_mode(Mode.PASS)
        assert client.ping()
        client.close()


async def test_swallow_reply_can_pick_replies_by_content(
    proxy: FaultProxy, real_redis: bus.Redis, real_redis_url: str
) -> None:
    await real_redis.mset({"plain": "hello", "marked": "secret"})
    proxy.set_mode(Mode.SWALLOW_REPLY, match=b"GET", reply_match=b"secret", times=1)
    async with plain_client(proxy.url(real_redis_url)) as client:
        assert await client.get("plain") == b"hello"  # request matched, reply did not: passes
        with pytest.raises(redis.ConnectionError):
            await client.get("marked")
        assert await client.get("marked") == b"secret"  # times=1 used up: passes again
    assert proxy.counters.swallowed == 1
