"""FAULTS 8: Redis comes back empty, and the workers notice (``bus/_epoch.py``).

An empty Redis answers like a healthy one: without the epoch check a worker recreates
its groups and waits forever for sagas that no longer exist. With it, running workers
stop with :class:`bus.RedisDataLost` (a worker process exits non-zero), leave the
``lost:<epoch>`` marker, and workers started later refuse until ``saga epoch accept``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

import bus
from bus import Bus, BusConfig, Envelope, Stream, Worker
from cli.main import app as cli
from tests.faults.server_load import SagaLoad, effects_tables
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]
__all__ = ["effects_tables"]  # the fixture, imported to be found by pytest
LOST = b"Redis lost its data"


async def exited(process: subprocess.Popen[bytes], *, within_s: float) -> int:
    """Poll until ``process`` exits; its exit code."""
    with anyio.fail_after(within_s):
        while process.poll() is None:
            await anyio.sleep(0.02)
    return process.returncode


@pytest.mark.postgres
async def test_workers_stop_loudly_when_redis_restarts_empty_and_wait_for_the_operator(
    tmp_path: Path, pg_dsn: str, effects_tables: str
) -> None:
    server = PrivateRedis(tmp_path / "redis")  # no persistence: a restart comes back empty
    await server.start()
    redis = bus.connect(server.url)
    load = SagaLoad(server, pg_dsn, effects_tables, tmp_path / "workers.log", sagas=50)
    try:
        await load.start(redis)
        first = load.spawn()
        await load.wait_ended(redis, 5, within_s=30)
        await server.restart()
        assert await exited(first, within_s=20) != 0  # not a silent hang, not a silent success
        assert LOST in load.log.read_bytes()
        marker = await bus.read_epoch(redis)
        assert marker is not None
        assert marker.startswith("lost:")

        load.log.write_bytes(b"")
        refused = load.spawn()  # a worker started later refuses too
        assert await exited(refused, within_s=20) != 0
        assert LOST in load.log.read_bytes()
        assert await redis.exists("rs:{crashctx:0}:inbox") == 0  # refused before writing anything

        show = ["epoch", "show", "--json", "--redis-url", server.url]
        shown = await anyio.to_thread.run_sync(CliRunner().invoke, cli, show)  # the CLI runs its own loop
        assert json.loads(shown.output) == {"epoch": marker, "lost": True}
        accept = ["epoch", "accept", "--yes", "--redis-url", server.url]
        result = await anyio.to_thread.run_sync(CliRunner().invoke, cli, accept)  # the CLI runs its own loop
        assert result.exit_code == 0, result.output
        accepted = await bus.read_epoch(redis)
        assert accepted is not None
        assert not accepted.startswith("lost:")
        load.sagas = 20
        await load.start(redis)  # the operator starts the lost sagas again
        load.spawn()
        await load.wait_ended(redis, load.sagas, within_s=30)
        assert await bus.read_epoch(redis) == accepted
    finally:
        load.stop_workers()
        await redis.aclose()
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
