"""``saga worker --metrics-port`` and ``saga health ready``, as separate processes on real Redis."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

import bus
from bus._epoch import join_epoch
from redsaga.cli.main import app
from tests.helpers import eventually
from tests.metrics.scrape import get, scrape, value

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def health_ready(port: int) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["health", "ready", "--port", str(port)])
    return result.exit_code, result.stderr or result.stdout


async def test_a_worker_serves_metrics_health_and_readiness_on_its_port(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    await join_epoch(real_redis)  # as the orders worker would: a participant only reads it
    port = free_port()
    code, said = health_ready(port)
    assert code == 1
    assert said.startswith(f"unhealthy: nothing answers at http://127.0.0.1:{port}/readyz")
    env = {**os.environ, "REDSAGA_REDIS_URL": real_redis_url, "REDSAGA_VERIFY": "off"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "redsaga.cli", "worker", "--app", "redsaga.examples.shipping:app"],
        env={**env, "REDSAGA_METRICS_PORT": str(port)},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        async def ready() -> bool:
            return (await anyio.to_thread.run_sync(health_ready, port))[0] == 0

        await eventually(ready, 60, "saga health ready passes")
        assert await get(port, "/healthz") == (200, "ok\n")
        samples = await scrape(port)
        shipping = {"stream": "orders/cmd:shipping", "partition": "0", "group": "shipping"}
        assert value(samples, "redsaga_stream_pending", **shipping) == 0
        assert value(samples, "redsaga_stream_lag", **shipping) == 0
        assert value(samples, "redsaga_handler_slots", state="free") == bus.BusConfig().concurrency
        assert (await get(port, "/nope"))[0] == 404

        # a second worker cannot take the same port: one line, exit 1
        taken = subprocess.run(
            [sys.executable, "-m", "redsaga.cli", "worker", "--app", "redsaga.examples.shipping:app"],
            env={**env, "REDSAGA_METRICS_PORT": str(port)},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert taken.returncode == 1, taken.stderr
        [line] = [x for x in taken.stderr.splitlines() if x.startswith("error:")]
        assert line.startswith(f"error: cannot serve metrics on 127.0.0.1:{port}:")
    finally:
        worker.send_signal(signal.SIGTERM)
        _, logs = worker.communicate(timeout=60)
    assert worker.returncode == 0, logs
