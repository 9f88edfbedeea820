"""``saga health worker|relay``, the compose health checks, against real workers and a real Redis."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import msgspec
import pytest
from typer.testing import CliRunner, Result

import bus
import relay
from bus._epoch import join_epoch
from redsaga.cli.main import app as cli
from saga import EngineConfig, SagaWorker
from saga.runtime.liveness import HEALTH_FILE_ENV
from tests.helpers import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
ROOT = Path(__file__).resolve().parents[2]


async def saga(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run ``saga ARGS`` in a thread (the command runs its own event loop)."""
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli, list(args), env=env))


@contextmanager
def worker_process(app: str, redis_url: str, health_file: Path) -> Iterator[subprocess.Popen[str]]:
    """``saga worker --app APP`` as a process of its own with a health file, stopped at the end."""
    env = {**os.environ, bus.URL_ENV: redis_url, HEALTH_FILE_ENV: str(health_file), "REDSAGA_VERIFY": "off"}
    process = subprocess.Popen(
        [sys.executable, "-m", "redsaga.cli", "worker", "--app", app],
        cwd=ROOT,
        env=env,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def exits(code: int, *args: str, env: dict[str, str] | None = None) -> Callable[[], Awaitable[bool]]:
    """A check for :func:`eventually`: ``saga ARGS`` exits with ``code``."""

    async def check() -> bool:
        return (await saga(*args, env=env)).exit_code == code

    return check


async def test_the_saga_worker_keeps_its_health_file_while_it_runs(
    real_redis_url: str, tmp_path: Path
) -> None:
    health_file = tmp_path / "health"
    env = {HEALTH_FILE_ENV: str(health_file)}
    before = await saga("health", "worker", env=env)
    assert (before.exit_code, before.stderr.strip()) == (
        1,
        (
            f"unhealthy: no health file at {health_file}: the worker has not started reading its streams "
            f"(or it was not given {HEALTH_FILE_ENV}={health_file})"
        ),
    )
    health_file.write_text("1000")  # an earlier run's file, long stale
    assert (await saga("health", "worker", env=env)).exit_code == 1
    with worker_process("redsaga.examples.orders:app", real_redis_url, health_file) as process:
        await eventually(exits(0, "health", "worker", env=env), 60, "the worker renewed its health file")
        found = json.loads((await saga("health", "worker", "--json", env=env)).stdout)
        assert found["healthy"] is True
        assert 0 <= found["age_ms"] <= 30_000
        process.terminate()
        assert process.wait(30) == 0
    gone = await saga("health", "worker", env=env)  # a stopped worker leaves no file behind
    assert gone.exit_code == 1
    assert gone.stderr.startswith(f"unhealthy: no health file at {health_file}")


async def test_the_health_file_goes_stale_while_redis_does_not_answer(
    real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
) -> None:
    from redsaga.examples.shipping import app as shipping_app
    from tests.faults.proxy import FaultProxy, Mode

    health_file = tmp_path / "health"
    check = ("health", "worker", "--file", str(health_file), "--max-age", "1")
    await join_epoch(real_redis)  # as the orders worker would: a participant's only reads it
    async with FaultProxy.to_url(real_redis_url, seed=3) as proxy:
        client = bus.connect(proxy.url(real_redis_url), bus.ClientConfig(socket_timeout_s=0.5))
        config = EngineConfig(health_file=str(health_file), heartbeat_ms=100)
        worker = SagaWorker(client, shipping_app, config=config)
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(worker.run)
                await eventually(exits(0, *check), 30, "the worker renews its file")
                proxy.set_mode(Mode.BLACKHOLE)
                await eventually(exits(1, *check), 30, "the file is stale while Redis is unreachable")
                stale = await saga(*check)
                assert "its event loop is stuck or its Redis does not answer" in stale.stderr
                proxy.set_mode(Mode.PASS)
                await eventually(exits(0, *check), 60, "the worker renews it again once Redis answers")
                worker.stop()
        finally:
            await client.aclose()
    assert not health_file.exists()


async def test_the_worker_check_refuses_bad_usage_in_one_line(tmp_path: Path) -> None:
    no_file = await saga("health", "worker", env={HEALTH_FILE_ENV: ""})
    assert (no_file.exit_code, no_file.stderr.strip()) == (
        1,
        f"error: no health file given: pass --file (or set {HEALTH_FILE_ENV})",
    )
    (tmp_path / "other").write_text("not a timestamp")
    foreign = await saga("health", "worker", "--file", str(tmp_path / "other"))
    assert foreign.exit_code == 1
    assert (
        foreign.stderr.strip()
        == f"error: {tmp_path / 'other'} is not a redsaga health file (it holds 'not a timestamp')"
    )
    usage = await saga("health", "worker", "--max-age", "0")
    assert usage.exit_code == 2


class Note(msgspec.Struct, tag=True):
    text: str


async def test_the_relay_is_healthy_while_no_row_waits_too_long(
    real_redis: bus.Redis, tmp_path: Path
) -> None:
    dsn = f"sqlite:///{tmp_path / 'outbox.db'}"
    await relay.init_db(dsn)
    env = {"REDSAGA_RELAY_DSN": dsn}
    empty = await saga("health", "relay", "--json", env=env)
    assert empty.exit_code == 0
    assert json.loads(empty.stdout) == {
        "healthy": True,
        "backlog": 0,
        "oldest_unsent_age_ms": None,
        "failed": 0,
        "max_age_s": 30.0,
        "problems": [],
    }
    with sqlite3.connect(tmp_path / "outbox.db") as conn:
        relay.outbox.add(conn, "notes", Note(text="hello"))
    assert (await saga("health", "relay", env=env)).exit_code == 0  # waiting, but not for long
    strict = ("health", "relay", "--max-age", "0.001")
    await eventually(exits(1, *strict, env=env), 10, "the unsent row has waited over a millisecond")
    stuck = await saga(*strict, env=env)
    assert "unhealthy: the oldest of 1 unsent outbox row(s) has waited" in stuck.stderr
    assert "(over --max-age 0.001s): the relay is not publishing" in stuck.stderr

    await relay.Relay.connect(dsn, real_redis).run(drain=True)
    published = await saga(*strict, env=env)
    assert (published.exit_code, published.stdout.strip()) == (
        0,
        "healthy: 0 row(s) unsent, none waiting too long",
    )


async def test_the_relay_check_of_a_database_it_cannot_read_is_one_line(tmp_path: Path) -> None:
    missing = await saga("health", "relay", "--dsn", f"sqlite:///{tmp_path / 'nothing.db'}")
    assert missing.exit_code == 1
    assert missing.stderr.startswith("error: ")
    assert len(missing.stderr.strip().splitlines()) == 1
    no_dsn = await saga("health", "relay", env={"REDSAGA_RELAY_DSN": "", "REDSAGA_PG_DSN": ""})
    assert (no_dsn.exit_code, no_dsn.stderr.strip()) == (
        1,
        "error: no database given: pass --dsn (or set REDSAGA_RELAY_DSN)",
    )
