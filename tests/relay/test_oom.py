"""Redis at maxmemory (FAULTS 12): rows stay pending, the relay backs off, then drains."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import bus
import relay
from tests.conftest import IN_CI
from tests.relay.conftest import OutboxDb
from tests.relay.helpers import Charged, wait_for
from tests.relay.processes import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.faults]


@pytest.fixture
async def private_redis(tmp_path: Path) -> AsyncIterator[bus.Redis]:
    """A redis-server of this test's own, so it may change maxmemory."""
    server = shutil.which("redis-server")
    if server is None:
        if IN_CI:
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = free_port()
    process = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
            "--maxmemory-policy",
            "noeviction",
        ],
        stdout=subprocess.DEVNULL,
    )
    client = bus.connect(f"redis://127.0.0.1:{port}/0")
    try:
        await wait_for(lambda: _answers(client), timeout_s=10)
        yield client
    finally:
        await client.aclose()
        process.kill()
        process.wait(10)


async def _answers(client: bus.Redis) -> bool:
    try:
        return bool(await client.ping())
    except bus.BusError:
        return False
    except Exception:
        return False


async def test_rows_stay_pending_while_redis_refuses_writes_and_drain_after(
    outbox_db: OutboxDb, private_redis: bus.Redis
):
    redis = private_redis
    await redis.set("ballast", "x" * 2_000_000)
    used = int((await redis.info("memory"))["used_memory"])
    await redis.config_set("maxmemory", used + 1024)  # just above what is used now

    outbox = relay.Outbox(outbox_db.tables)
    conn = outbox_db.connect()
    for i in range(20):
        outbox.add(conn, "payments", Charged(order=f"o{i}", note="y" * 1000))
    conn.commit()
    conn.close()

    worker = relay.Relay.connect(outbox_db.dsn, redis, config=outbox_db.config())
    try:
        await worker.store.open()
        done = await worker.step()
        assert done.refused  # Redis said OOM: back off, nothing marked
        assert worker.counters.deferred == 20
        assert outbox_db.query("SELECT count(*) FROM {outbox} WHERE status = 0") == [(20,)]
        assert await redis.xlen(bus.Stream.named("payments").key) == 0  # no partial write
        assert await redis.zcard(bus.Stream.named("payments").published_key) == 0  # and no dedupe mark
    finally:
        await worker.close()

    await redis.config_set("maxmemory", 0)
    await relay.Relay.connect(outbox_db.dsn, redis, config=outbox_db.config()).run(drain=True)
    assert await redis.xlen(bus.Stream.named("payments").key) == 20
    assert outbox_db.query("SELECT count(*) FROM {outbox} WHERE status = 1") == [(20,)]
