"""Catalogue item 9: the function libraries flushed (``FUNCTION FLUSH``, as after a restart
without persistence) under load.

Scripts are functions (``FCALL``); a call that meets "function not found" did not run, so
its library is loaded and the call sent again (``bus/_scripts.py``). In a pipeline only the
calls that met the missing library are re-sent: the calls before the flush ran already and
must not run twice. redsaga's transactional (MULTI) pipelines carry plain reads only, never
a script, so they cannot meet a missing function.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
import pytest
import redis.asyncio

import bus
from bus._scripts import CommandCall, Library, ReplicaAcks, run_batch
from tests.faults.scenario import open_scenario
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]
SAGAS = 200


LIBRARY = Library.build(
    "test",
    {
        "count": f"-- {uuid.uuid4()}\nreturn redis.call('INCR', KEYS[1])",  # not idempotent: a re-run shows
        "bad": "return redis.error_reply('ERR no')",
    },
)
COUNT = LIBRARY.script("count")


@pytest.mark.parametrize("lean", [True, False], ids=["bus-client", "plain-redis-py"])
async def test_a_flush_mid_pipeline_reruns_only_the_calls_that_did_not_run(
    private_redis_server: PrivateRedis, lean: bool
) -> None:
    client = (
        bus.connect(private_redis_server.url)
        if lean
        else redis.asyncio.Redis.from_url(private_redis_server.url)
    )
    try:
        await COUNT(client, ["before"], [])  # loaded: the calls before the flush run at once
        results = await run_batch(
            client,
            [
                COUNT.call(["before"], []),
                CommandCall(("FUNCTION", "FLUSH")),
                COUNT.call(["after"], []),
                COUNT.call(["after"], []),
            ],
        )
        assert results[0] == 2
        assert results[2:] == [1, 2]
        assert await client.mget("before", "after") == [b"2", b"2"]  # nothing ran twice
    finally:
        await client.aclose()


@pytest.mark.postgres
async def test_function_flush_over_and_over_under_load_is_invisible(tmp_path: Path, pg_dsn: str) -> None:
    server = PrivateRedis(tmp_path / "redis", options=("--maxmemory-policy", "noeviction"))
    await server.start()
    flusher = bus.connect(server.url)
    flushes = 0
    try:
        async with open_scenario(server.url, pg_dsn, tmp_path / "logs") as scenario:
            workers = [await scenario.worker("w1"), await scenario.worker("w2")]
            orders = scenario.mixed(SAGAS)
            async with anyio.create_task_group() as tg:

                async def flush_until_all_ended() -> None:
                    nonlocal flushes
                    while await scenario.ended() < SAGAS:  # one flush per round trip
                        await flusher.function_flush()
                        flushes += 1

                tg.start_soon(flush_until_all_ended)
                ids = await scenario.start(orders)  # the client's starts raise on any error
                await scenario.wait_ended(SAGAS, timeout=60)
            await scenario.check(ids, dead_letters=0)
            assert all(w.alive for w in workers)
            assert flushes > 10
            logs = [w.log_path.read_text() for w in workers]
            assert not any("Function not found" in log or "not loaded" in log for log in logs)
    finally:
        await flusher.aclose()
        server.kill()


async def test_replica_acks_end_the_pipeline_and_fail_only_the_calls_that_wrote(
    private_redis: bus.Redis,
) -> None:
    acks = ReplicaAcks(replicas=1, timeout_ms=10)  # the private server has no replica
    bad = LIBRARY.script("bad")
    await private_redis.function_flush()  # the re-send after loading ends with a WAIT too
    results = await run_batch(private_redis, [COUNT.call(["n"], []), bad.call([], [])], acks=acks)
    assert isinstance(results[0], bus.ReplicaAckTimeout)
    assert (results[0].acked, results[0].wanted) == (0, 1)
    assert isinstance(results[1], bus.RedisCommandError)  # its own error, not the replicas'
    assert await private_redis.get("n") == b"1"  # the write stands on the master
    assert await run_batch(private_redis, [COUNT.call(["n"], [])], acks=ReplicaAcks(0, 10)) == [2]
