"""The relay's metrics and readiness: scraped over HTTP, checked against the rows added and sent.

The contract tests run on SQLite (fakeredis) and PostgreSQL (real Redis); the outbox's
figures are read from the database at scrape time, the rows sent are the relay's counters.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import bus
import relay
from bus._epoch import EPOCH_KEY, join_epoch
from relay.metrics import RELAY_METRICS, RelayMetrics
from tests.helpers import eventually
from tests.metrics.scrape import Samples, get, parse, scrape, value
from tests.metrics.test_worker_cli import free_port, health_ready
from tests.relay.conftest import OutboxDb
from tests.relay.helpers import Charged

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]


def add(db: OutboxDb, clock: bus.FakeClock, stream: str, *orders: str) -> None:
    outbox = relay.Outbox(db.tables, clock=clock)
    conn = db.connect()
    try:
        for order in orders:
            outbox.add(conn, stream, Charged(order=order))
        conn.commit()
    finally:
        conn.close()


async def rounds(worker: relay.Relay) -> None:
    """Publish every pending row, round by round (on the relay's fake clock: no waits)."""
    await worker.store.open()
    try:
        while (await worker.step()).claimed:
            pass
    finally:
        await worker.close()


@asynccontextmanager
async def serving(metrics: RelayMetrics) -> AsyncIterator[int]:
    async with anyio.create_task_group() as tasks:
        yield await tasks.start(metrics.server().serve)
        tasks.cancel_scope.cancel()


def outbox(samples: Samples, name: str, table: str) -> float | None:
    """The sample of ``name`` for ``table``, in whichever database (``None``: missing)."""
    found = [v for (n, labels), v in samples.items() if n == name and ("table", table) in labels]
    assert len(found) <= 1, found
    return found[0] if found else None


async def test_the_backlog_its_oldest_row_and_the_rows_sent_follow_the_outbox(
    outbox_db: OutboxDb, relay_redis: bus.Redis
) -> None:
    clock = bus.FakeClock()
    table = outbox_db.tables.outbox
    worker = relay.Relay.connect(outbox_db.dsn, relay_redis, config=outbox_db.config(), clock=clock)
    metrics = RelayMetrics(worker)
    await relay_redis.set(bus.Stream.named("wrongtype").key, "not a stream")
    async with serving(metrics) as port:
        empty = await scrape(port)
        assert outbox(empty, "redsaga_outbox_backlog", table) == 0
        assert outbox(empty, "redsaga_outbox_oldest_unsent_seconds", table) == 0
        assert outbox(empty, "redsaga_relay_database_up", table) == 1

        add(outbox_db, clock, "payments", "a")
        clock.advance(2)
        add(outbox_db, clock, "payments", "b", "c")
        add(outbox_db, clock, "wrongtype", "d")
        clock.advance(3.5)
        waiting = await scrape(port)
        assert outbox(waiting, "redsaga_outbox_backlog", table) == 4
        assert outbox(waiting, "redsaga_outbox_oldest_unsent_seconds", table) == 5.5
        assert outbox(waiting, "redsaga_outbox_failed", table) == 0
        assert value(waiting, "redsaga_relay_rows_total", table=table, outcome="sent") == 0

        await rounds(worker)
        sent = await scrape(port)
        assert outbox(sent, "redsaga_outbox_backlog", table) == 0
        assert outbox(sent, "redsaga_outbox_oldest_unsent_seconds", table) == 0
        assert outbox(sent, "redsaga_outbox_failed", table) == 1
        assert value(sent, "redsaga_relay_rows_total", table=table, outcome="sent") == 3
        assert value(sent, "redsaga_relay_rows_total", table=table, outcome="failed") == 1
        assert value(sent, "redsaga_relay_rows_total", table=table, outcome="repeat") == 0
        assert value(sent, "redsaga_relay_outages_total", table=table) == 0

        add(outbox_db, clock, "payments", "e")
        clock.advance(1.25)
        later = await scrape(port)
        assert outbox(later, "redsaga_outbox_backlog", table) == 1
        assert outbox(later, "redsaga_outbox_oldest_unsent_seconds", table) == 1.25
        exported = {name for name, _ in later}
        assert exported <= {sample for spec in RELAY_METRICS for sample in spec.samples}


async def test_ready_once_the_database_and_redis_answer_and_the_epoch_stays(
    outbox_db: OutboxDb, relay_redis: bus.Redis
) -> None:
    worker = relay.Relay.connect(outbox_db.dsn, relay_redis, config=outbox_db.config())
    async with serving(RelayMetrics(worker)) as port:
        assert await get(port, "/healthz") == (200, "ok\n")
        assert await get(port, "/readyz") == (
            503,
            "rs:epoch is not set: no orchestrator has started on this Redis yet\n",
        )
        epoch = await join_epoch(relay_redis)  # the first orchestrator's worker starts
        assert await get(port, "/readyz") == (200, "ready\n")
        await relay_redis.set(EPOCH_KEY, "another")  # Redis came back with someone else's data
        assert await get(port, "/readyz") == (
            503,
            f"rs:epoch holds 'another', not the epoch {epoch!r} this relay saw first\n",
        )
        await relay_redis.set(EPOCH_KEY, f"lost:{epoch}")  # a worker found its data gone
        status, text = await get(port, "/readyz")
        assert (status, text) == (
            503,
            f"Redis lost its data: rs:epoch holds 'lost:{epoch}' (saga epoch accept, once restored)\n",
        )


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
async def test_a_database_that_does_not_answer_is_reported_not_shown_stale(
    dialect: str, tmp_path: Path, fake_redis: bus.Redis
) -> None:
    dsn = f"sqlite:///{tmp_path / 'gone.db'}" if dialect == "sqlite" else "postgresql://x@127.0.0.1:1/none"
    worker = relay.Relay.connect(dsn, fake_redis, config=relay.RelayConfig(poll_interval_s=0.05))
    await join_epoch(fake_redis)
    metrics = RelayMetrics(worker)
    async with serving(metrics) as port:
        samples = await scrape(port)
        assert outbox(samples, "redsaga_relay_database_up", "redsaga_outbox") == 0
        assert outbox(samples, "redsaga_outbox_backlog", "redsaga_outbox") is None  # missing, not 0
        status, text = await get(port, "/readyz")
        assert status == 503
        [problem] = text.splitlines()
        assert problem.startswith("the outbox database does not answer: ")


async def test_outages_are_counted_while_the_relay_waits_for_its_database(fake_redis: bus.Redis) -> None:
    clock = bus.FakeClock()  # the back-off waits on it: the relay stays in its first outage
    worker = relay.Relay.connect("postgresql://x@127.0.0.1:1/none", fake_redis, clock=clock)
    metrics = RelayMetrics(worker)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(worker.run)
        await eventually(lambda: worker.counters.outages == 1, 10, "the relay meets the outage")
        samples = parse((await metrics.exposition()).decode())
        assert value(samples, "redsaga_relay_outages_total", table="redsaga_outbox") == 1
        worker.stop()


async def test_a_service_that_serves_metrics_already_passes_its_registry(
    sqlite_db: OutboxDb, fake_redis: bus.Redis
) -> None:
    """As with prometheus_client.start_http_server: the registry is rendered on another thread."""
    registry = CollectorRegistry()
    worker = relay.Relay.connect(sqlite_db.dsn, fake_redis, config=sqlite_db.config())
    metrics = RelayMetrics(worker, registry=registry)
    add(sqlite_db, bus.FakeClock(), "payments", "a", "b")
    text = (await anyio.to_thread.run_sync(generate_latest, registry)).decode()
    assert value(parse(text), "redsaga_outbox_backlog", table="redsaga_outbox") == 2
    metrics.close()
    assert "redsaga_outbox" not in generate_latest(registry).decode()


@pytest.mark.redis
async def test_saga_relay_serves_metrics_and_readiness_on_its_port(
    sqlite_db: OutboxDb, real_redis: bus.Redis, real_redis_url: str
) -> None:
    await join_epoch(real_redis)
    add(sqlite_db, bus.FakeClock(), "payments", "a")
    port = free_port()
    env = {**os.environ, "REDSAGA_METRICS_PORT": str(port)}
    args = ["relay", "--dsn", sqlite_db.dsn, "--redis-url", real_redis_url, "--poll-interval", "0.05"]
    process = subprocess.Popen(
        [sys.executable, "-m", "redsaga.cli", *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        async def ready() -> bool:
            return (await anyio.to_thread.run_sync(health_ready, port))[0] == 0

        await eventually(ready, 60, "saga health ready passes for the relay")

        async def published() -> bool:
            return value(await scrape(port), "redsaga_relay_rows_total", outcome="sent") == 1

        await eventually(published, 30, "the relay's metrics count the row it sent")
        samples = await scrape(port)
        outbox_labels = [dict(labels) for name, labels in samples if name == "redsaga_outbox_backlog"]
        assert outbox_labels == [
            {"table": sqlite_db.tables.outbox, "database": sqlite_db.dsn.removeprefix("sqlite:///")}
        ]
        assert value(samples, "redsaga_outbox_backlog") == 0
        assert value(samples, "redsaga_build_info", python=platform.python_version()) == 1
        assert await real_redis.xlen(bus.Stream.named("payments").key) == 1
    finally:
        process.send_signal(signal.SIGTERM)
        out, logs = process.communicate(timeout=60)
    assert process.returncode == 0, logs
    assert out.split() == ["sent", "repeats", "failed", "outages", "1", "0", "0", "0"]


@pytest.mark.parametrize(
    ("dsn", "database"),
    [
        ("postgresql://payments:secret@db.internal:6543/payments", "db.internal:6543/payments"),
        ("host=db.internal dbname=inventory password=secret", "db.internal:5432/inventory"),
        ("sqlite:///inventory.db", "inventory.db"),
    ],
)
def test_the_database_label_tells_databases_apart_without_credentials(dsn: str, database: str) -> None:
    worker = relay.Relay.connect(dsn, bus.connect(bus.MEMORY_URL))
    metrics = RelayMetrics(worker, registry=CollectorRegistry())
    assert metrics.outbox.labels == ("redsaga_outbox", database)
    assert "secret" not in database
