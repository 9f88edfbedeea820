"""The client's fast paths keep redis-py's behaviour: pool waits, replies in step, timeouts."""

from __future__ import annotations

import anyio
import pytest
from redis.exceptions import ConnectionError as ConnectionError_
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as TimeoutError_

import bus
from bus._connection import send_batch
from bus._redispy import LeanConnection
from tests.faults.servers import PrivateRedis

pytestmark = pytest.mark.anyio


async def test_a_checkout_waits_for_a_free_connection_when_all_are_taken(real_redis_url: str) -> None:
    client = bus.connect(real_redis_url, bus.ClientConfig(max_connections=2))
    pool = client.connection_pool
    first, second = await pool.get_connection(), await pool.get_connection()
    got: list[object] = []

    async def third() -> None:
        got.append(await pool.get_connection())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(third)
            await anyio.sleep(0.05)
            assert got == []  # waits: the pool is full
            await pool.release(first)
        assert got == [first]
    await pool.release(second)
    await pool.release(first)
    assert await client.ping()
    await client.aclose()


async def test_a_batch_keeps_error_replies_in_place_and_the_connection_in_step(real_redis: bus.Redis) -> None:
    await real_redis.set("s", "text")
    replies = await send_batch(
        real_redis, [("SET", "a", "1"), ("HGETALL", "s"), ("HSET", "h", "f", "v"), ("HGETALL", "h")]
    )
    assert replies[0] is True
    assert isinstance(replies[1], ResponseError)
    assert replies[2:] == [1, {b"f": b"v"}]
    assert await real_redis.get("a") == b"1"  # the next command reads its own reply


async def test_a_batch_cut_short_leaves_no_reply_for_the_next_command(real_redis: bus.Redis) -> None:
    await real_redis.set("x", "value")
    with anyio.move_on_after(0.1):
        await send_batch(real_redis, [("BLPOP", "nothing", "1"), ("GET", "x")])
    for _ in range(3):  # whichever pooled connection is used, its replies are its own
        assert await real_redis.get("x") == b"value"
        assert await send_batch(real_redis, [("GET", "x"), ("GET", "missing")]) == [b"value", None]


async def test_the_embedded_server_takes_the_same_batches(fake_redis: bus.Redis) -> None:
    await fake_redis.set("s", "text")
    replies = await send_batch(fake_redis, [("HGETALL", "s"), ("HSET", "h", "f", "v"), ("HGETALL", "h")])
    assert isinstance(replies[0], ResponseError)
    assert replies[1:] == [1, {b"f": b"v"}]


async def test_a_link_closed_under_a_free_connection_is_sent_again_on_a_new_one(
    real_redis: bus.Redis,
) -> None:
    pool = real_redis.connection_pool
    assert await send_batch(real_redis, [("SET", "k", "v")]) == [True]
    connection = pool._available_connections[-1]
    connection._writer.transport.close()  # closing now; the loop reports it lost a turn later
    assert await send_batch(real_redis, [("GET", "k"), ("ECHO", "x")]) == [b"v", b"x"]
    assert connection.is_connected  # connected again by the retry, not dropped from the pool
    assert connection in pool._available_connections


async def test_a_failing_batch_is_tried_as_often_as_the_retry_policy_says(
    real_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = bus.connect(real_redis_url, bus.ClientConfig(retries=2))
    attempts: list[int] = []

    async def lost(self: object, commands: object) -> list[object]:
        attempts.append(1)
        raise ConnectionError_("link lost")

    monkeypatch.setattr(LeanConnection, "exchange", lost)
    with pytest.raises(ConnectionError_):
        await send_batch(client, [("PING",)])
    assert len(attempts) == 3  # the first try and two retries, as redis-py's own pipeline makes
    monkeypatch.undo()
    assert await send_batch(client, [("PING",)], parse=False) == [b"PONG"]  # the connection came back
    await client.aclose()


async def test_an_error_no_retry_covers_ends_the_batch_at_once(real_redis: bus.Redis) -> None:
    with pytest.raises(TypeError, match="must be str, int, float or bytes"):  # hiredis's packer
        await send_batch(real_redis, [("SET", "k", object())])
    assert await send_batch(real_redis, [("ECHO", "next")]) == [b"next"]


async def test_a_batch_bigger_than_the_socket_buffer_waits_for_it_to_drain(real_redis: bus.Redis) -> None:
    big = b"x" * (8 << 20)
    assert await send_batch(real_redis, [("SET", "big", big), ("STRLEN", "big")]) == [True, 8 << 20]


async def test_a_due_health_check_runs_before_the_batch(
    real_redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = real_redis.connection_pool
    assert await send_batch(real_redis, [("SET", "k", "v")]) == [True]
    connection = pool._available_connections[-1]
    checks: list[float] = []
    check_health = connection.check_health

    async def checked() -> None:
        checks.append(connection.next_health_check)
        await check_health()

    monkeypatch.setattr(connection, "check_health", checked)
    connection.next_health_check = 0  # due: redis-py's PING goes first, on the same connection
    replies = await send_batch(real_redis, [("GET", "k"), ("OBJECT ENCODING", "k")], parse=False)
    assert replies == [b"v", b"embstr"]  # a command name with a space is split, as redis-py does
    assert checks == [0]
    assert connection.next_health_check > 0
    assert await send_batch(real_redis, [("GET", "k")]) == [b"v"]
    assert checks == [0]  # not due again


@pytest.mark.redis
async def test_a_write_a_stopped_server_never_takes_times_out_and_the_connection_is_dropped(
    private_redis_server: PrivateRedis,
) -> None:
    client = bus.connect(private_redis_server.url, bus.ClientConfig(socket_timeout_s=0.5, retries=0))
    assert await send_batch(client, [("PING",)], parse=False) == [b"PONG"]
    connection = client.connection_pool._available_connections[-1]
    private_redis_server.pause()  # it keeps its socket open and reads nothing: the buffers fill
    try:
        with pytest.raises(TimeoutError_, match="Timeout writing to socket"):
            await send_batch(client, [("SET", "big", b"x" * (64 << 20))], parse=False)
        assert not connection.is_connected  # a send cut short: never reused
    finally:
        private_redis_server.resume()
    assert await send_batch(client, [("PING",)], parse=False) == [b"PONG"]
    await client.aclose()
