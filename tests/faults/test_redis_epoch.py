"""Catalogue item 8: Redis comes back empty, and the workers notice (``bus/_epoch.py``).

An empty Redis answers like a healthy one: without the epoch check a worker recreates
its groups and waits forever for sagas that no longer exist. With it, running workers
stop with :class:`bus.RedisDataLost` (a worker process exits non-zero), leave the
``lost:<epoch>`` marker, and workers started later refuse until ``saga epoch accept``.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

import bus
from bus import Bus, BusConfig, Envelope, Stream, Worker
from redsaga.cli.main import app as cli
from saga.store.keys import Partition
from tests.faults.app import CONTEXT, Order
from tests.faults.scenario import open_scenario
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]
LOST = "Redis lost its data"


@pytest.mark.postgres
async def test_workers_stop_loudly_when_redis_restarts_empty_and_wait_for_the_operator(
    tmp_path: Path, pg_dsn: str
) -> None:
    server = PrivateRedis(tmp_path / "redis")  # no persistence: a restart comes back empty
    await server.start()
    try:
        async with open_scenario(server.url, pg_dsn, tmp_path / "logs") as scenario:
            redis = scenario.redis
            await scenario.start(Order(id=f"lost-{n}") for n in range(50))
            first = await scenario.worker("first")
            await scenario.wait_ended(5)
            await server.restart()
            assert await first.wait_exit() != 0  # not a silent hang, not a silent success
            assert LOST in first.log_path.read_text()
            marker = await bus.read_epoch(redis)
            assert marker is not None
            assert marker.startswith("lost:")

            refused = scenario.spawn("refused")  # a worker started later refuses too
            assert await refused.wait_exit() != 0
            assert LOST in refused.log_path.read_text()
            inbox = Partition(CONTEXT.name, 0).inbox.key
            assert await redis.exists(inbox) == 0  # refused before writing anything

            show = ["epoch", "show", "--json", "--redis-url", server.url]
            shown = await anyio.to_thread.run_sync(CliRunner().invoke, cli, show)  # the CLI runs its own loop
            assert json.loads(shown.output) == {"epoch": marker, "lost": True}
            accept = ["epoch", "accept", "--yes", "--redis-url", server.url]
            result = await anyio.to_thread.run_sync(
                CliRunner().invoke, cli, accept
            )  # the CLI runs its own loop
            assert result.exit_code == 0, result.output
            accepted = await bus.read_epoch(redis)
            assert accepted is not None
            assert not accepted.startswith("lost:")
            # the operator starts the lost sagas again (new ids: the first run's effects stay)
            ids = await scenario.start(Order(id=f"again-{n}") for n in range(20))
            await scenario.worker("after")
            await scenario.check(ids, dead_letters=0)
            assert await bus.read_epoch(redis) == accepted
    finally:
        server.kill()


def jobs_app() -> Bus:
    """A bus app with one handler that does nothing."""
    app = Bus("epoch-test")

    @app.handler(Stream.named("jobs"), None)
    async def handle(_envelope: Envelope) -> None:
        return None

    return app


async def test_flushall_stops_a_running_worker_with_a_typed_error(private_redis: bus.Redis) -> None:
    worker = Worker(private_redis, jobs_app(), config=BusConfig(block_ms=100, epoch_check_ms=200))
    joined = await bus.read_epoch(private_redis)
    assert joined is None  # a brand-new deployment: the first worker creates the epoch
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:

            async def flush_once_started() -> None:
                await worker.started.wait()
                await private_redis.flushall()

            tg.start_soon(flush_once_started)
            with pytest.raises(bus.RedisDataLost) as raised:
                await worker.run()
    assert raised.value.expected == worker.epoch
    assert raised.value.found is None
    assert not raised.value.retryable
    assert await bus.read_epoch(private_redis) == f"lost:{worker.epoch}"


async def test_workers_of_a_new_deployment_share_one_epoch_without_ceremony(private_redis: bus.Redis) -> None:
    workers = [Worker(private_redis, jobs_app()) for _ in range(3)]
    async with anyio.create_task_group() as tg:
        for worker in workers:
            tg.start_soon(worker.preflight)
    assert {w.epoch for w in workers} == {await bus.read_epoch(private_redis)}
