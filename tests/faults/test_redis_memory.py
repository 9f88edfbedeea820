"""FAULTS 12 for producers: Redis at ``maxmemory`` refuses starts and publishes cleanly.

A refused call raises the typed, retryable :class:`bus.RedisOutOfMemory` and leaves no
partial state. Lua scripts do not roll back, but Redis 7.0 refuses a command that may grow
memory (``HSET``, ``ZADD``, ``XADD``…) in a script that began over the limit only while
the script has written nothing yet: a refusal can only come before the first write. So
a script is refused at ``maxmemory`` only if its first write is such a command; the start
(``HSET``) and publish (``ZADD``) scripts make sure of it.
Once the limit is raised, everything drains. (The relay's side: tests/relay/test_redis_refusals.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

import bus
from saga import SagaClient, SagaNotFound
from tests.faults.server_load import SagaLoad, effects_tables
from tests.faults.servers import PrivateRedis
from tests.saga.crash_app import Do, Job, app, crash

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis, pytest.mark.postgres]
__all__ = ["effects_tables"]  # the fixture, imported to be found by pytest


async def test_starts_and_publishes_are_refused_at_maxmemory_and_drain_after(
    tmp_path: Path, pg_dsn: str, effects_tables: str
) -> None:
    server = PrivateRedis(tmp_path / "redis", appendfsync="everysec")
    await server.start()
    redis = bus.connect(server.url)
    client = SagaClient(redis, app.registry)
    load = SagaLoad(server, pg_dsn, effects_tables, tmp_path / "workers.log", sagas=60)
    late = Job(id="late")
    try:
        await load.start(redis)
        load.spawn()
        await load.wait_ended(redis, 10, within_s=30)
        await redis.set("ballast", "x" * 8_000_000)
        # below what is used by more than client buffers swing, so every write is refused
        await redis.config_set("maxmemory", int((await redis.info("memory"))["used_memory"]) - 4_000_000)

        with pytest.raises(bus.RedisOutOfMemory) as refused:
            await client.start(crash, late, saga_id=late.id)
        assert refused.value.retryable
        with pytest.raises(SagaNotFound):
            await client.get(late.id)
        assert await redis.exists("rs:{crashctx:0}:saga:late", "rs:{crashctx:0}:hist:late") == 0
        for index in ("rs:{crashctx:0}:active", "rs:{crashctx:0}:by_status"):
            assert await redis.type(index) in (b"none", b"zset")
        commands = await redis.xrange("rs:{crashctx:0}:cmd:worker")
        assert not any(b"late" in value for _, fields in commands for value in fields.values())

        stream = bus.Stream.named("elsewhere")
        publisher = bus.Publisher(redis, source="test")
        with pytest.raises(bus.RedisOutOfMemory):
            await publisher.publish(stream, Do(step="one"), message_id="m-1")
        assert await redis.exists(stream.key, stream.published_key) == 0

        await redis.config_set("maxmemory", 0)
        assert await publisher.publish(stream, Do(step="one"), message_id="m-1") is not None
        await client.start(crash, late, saga_id=late.id)  # the caller's retry
        load.jobs.append(late)
        load.sagas += 1
        await load.wait_ended(redis, load.sagas, within_s=60)
    finally:
        load.stop_workers()
    try:
        await load.check(redis)
    finally:
        await redis.aclose()
        server.kill()
