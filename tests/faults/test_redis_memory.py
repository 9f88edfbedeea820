"""Catalogue item 12 for producers: Redis at ``maxmemory`` refuses starts and publishes cleanly.

A refused call raises the typed, retryable :class:`bus.RedisOutOfMemory` and leaves no
partial state. Lua scripts do not roll back, but they run as Redis Functions, and Redis 7.0
refuses a function at ``maxmemory`` as a whole, before it runs, unless it is flagged
``allow-oom`` (only the ones that never grow memory are: acks, heartbeats, trims).
Once the limit is raised, everything drains. (The relay's side: tests/relay/test_redis_refusals.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

import bus
from saga import SagaNotFound, SagaStatus
from saga.store.keys import Partition
from tests.faults.app import CONTEXT, Do, Order, order
from tests.faults.scenario import open_scenario
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis, pytest.mark.postgres]


async def test_starts_and_publishes_are_refused_at_maxmemory_and_drain_after(
    tmp_path: Path, pg_dsn: str
) -> None:
    server = PrivateRedis(tmp_path / "redis", appendfsync="everysec")
    await server.start()
    try:
        async with open_scenario(server.url, pg_dsn, tmp_path / "logs") as scenario:
            redis = scenario.redis
            ids = await scenario.start(scenario.mixed(60))
            await scenario.worker("w1")
            await scenario.wait_ended(10)
            await redis.set("ballast", "x" * 8_000_000)
            # below what is used by more than client buffers swing, so every write is refused
            await redis.config_set("maxmemory", int((await redis.info("memory"))["used_memory"]) - 4_000_000)

            late = Order(id="late")
            with pytest.raises(bus.RedisOutOfMemory) as refused:
                await scenario.client.start(order, late, saga_id=late.id)
            assert refused.value.retryable
            with pytest.raises(SagaNotFound):
                await scenario.client.get(late.id)
            partition = Partition(CONTEXT.name, 0)
            assert await redis.exists(partition.saga(late.id), partition.history(late.id)) == 0
            for index in (partition.by_status(s) for s in SagaStatus):
                assert await redis.zscore(index, late.id) is None
            commands = await redis.xrange(partition.commands("shop").key)
            assert not any(b"late" in value for _, fields in commands for value in fields.values())

            stream = bus.Stream.named("elsewhere")
            publisher = bus.Publisher(redis, source="test")
            with pytest.raises(bus.RedisOutOfMemory):
                await publisher.publish(stream, Do(step="reserve", order=late), message_id="m-1")
            assert await redis.exists(stream.key, stream.published_key) == 0

            await redis.config_set("maxmemory", 0)
            assert (
                await publisher.publish(stream, Do(step="reserve", order=late), message_id="m-1") is not None
            )
            ids += await scenario.start([late])  # the caller's retry
            await scenario.check(ids, timeout=60, dead_letters=0)
    finally:
        server.kill()
