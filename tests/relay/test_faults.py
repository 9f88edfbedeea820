"""Fault tests with real processes: SIGKILL the relay, restart PostgreSQL under it (catalogue 17, 18)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import bus
import relay
from bus.lowlevel import AFTER_XADD_BEFORE_MARK_SENT
from tests.faults.servers import PrivatePostgres, PrivateRedis
from tests.relay.conftest import OutboxDb, in_thread
from tests.relay.helpers import Charged, entries, wait_for
from tests.relay.processes import start_relay

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.slow]


def _fill(db: OutboxDb, count: int, *, keys: int = 0, start: int = 0) -> None:
    outbox = relay.Outbox(db.tables)
    conn = db.connect()
    try:
        for i in range(start, start + count):
            key = f"saga-{i % keys}" if keys else None
            outbox.add(conn, "payments", Charged(order=f"o{i}", seq=i), ordering_key=key)
        conn.commit()
    finally:
        conn.close()


def _tables_arg(db: OutboxDb) -> str | None:
    prefix = db.tables.outbox.removesuffix("_outbox")
    return None if prefix == "redsaga" else prefix


async def _assert_each_row_once(db: OutboxDb, redis: bus.Redis, count: int) -> None:
    published = [envelope for _, envelope in await entries(redis)]
    ids = [e.id for e in published]
    assert len(ids) == len(set(ids)) == count, "a row was lost or published twice"
    rows = db.query("SELECT message_id, status FROM {outbox}")
    assert {message_id for message_id, _ in rows} == set(ids)
    assert {status for _, status in rows} == {1}


async def test_sigkill_between_xadd_and_mark_sent_adds_no_duplicate_on_restart(
    outbox_db: OutboxDb, real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
):
    _fill(outbox_db, 50)
    crashed = start_relay(
        outbox_db.dsn,
        real_redis_url,
        tmp_path / "relay.log",
        "--drain",
        crash_at=AFTER_XADD_BEFORE_MARK_SENT,
        tables=_tables_arg(outbox_db),
    )
    assert crashed.wait() == -signal.SIGKILL
    assert await real_redis.xlen("rs:{payments}:stream") == 50  # published…
    assert outbox_db.query("SELECT count(*) FROM {outbox} WHERE status = 0") == [(50,)]  # …not marked

    restarted = start_relay(
        outbox_db.dsn, real_redis_url, tmp_path / "relay.log", "--drain", tables=_tables_arg(outbox_db)
    )
    assert restarted.wait() == 0
    counters = restarted.counters()
    assert (counters["sent"], counters["repeats"]) == (0, 50)
    await _assert_each_row_once(outbox_db, real_redis, 50)


async def test_sigkill_during_batches_loses_nothing_and_duplicates_nothing(
    postgres_db: OutboxDb, real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
):
    _fill(postgres_db, 3000, keys=40)
    log = tmp_path / "relay.log"
    tables = _tables_arg(postgres_db)
    # Killed at its own crash point on the fourth batch…
    first = start_relay(
        postgres_db.dsn,
        real_redis_url,
        log,
        "--batch-size",
        "100",
        "--drain",
        crash_at="after_xadd_before_mark_sent:4",
        tables=tables,
    )
    assert first.wait() == -signal.SIGKILL
    # …then from outside, at whatever point it has reached.
    second = start_relay(
        postgres_db.dsn, real_redis_url, log, "--batch-size", "100", "--drain", tables=tables
    )
    await wait_for(lambda: _xlen_at_least(real_redis, 1500), timeout_s=30)
    second.kill()
    assert second.wait() == -signal.SIGKILL
    third = start_relay(postgres_db.dsn, real_redis_url, log, "--batch-size", "100", "--drain", tables=tables)
    assert third.wait() == 0

    await _assert_each_row_once(postgres_db, real_redis, 3000)
    by_key: dict[int, list[int]] = {}
    for _, envelope in await entries(real_redis):
        seq = envelope.decode(Charged).seq
        by_key.setdefault(seq % 40, []).append(seq)
    assert all(seqs == sorted(seqs) for seqs in by_key.values()), "a key's rows went out of order"


async def test_the_relay_recovers_when_postgres_restarts_under_it(
    private_pg: PrivatePostgres, real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
):
    db = OutboxDb("postgresql", private_pg.dsn, relay.Tables())
    in_thread(relay.init_db, db.dsn, db.tables)
    worker = start_relay(db.dsn, real_redis_url, tmp_path / "relay.log", "--poll-interval", "0.2")
    try:
        _fill(db, 100)
        await wait_for(lambda: _xlen_at_least(real_redis, 100), timeout_s=15)

        private_pg.stop("immediate")  # a crash: no shutdown checkpoint
        private_pg.start()
        _fill(db, 100, start=100)  # committed after the restart; the relay must reconnect to see them
        await wait_for(lambda: _xlen_at_least(real_redis, 200), timeout_s=30)

        worker.signal(signal.SIGTERM)  # graceful: finishes its round and exits 0
        assert worker.wait(30) == 0
        assert worker.counters()["outages"] >= 1
    finally:
        worker.kill()
    await _assert_each_row_once(db, real_redis, 200)


async def test_rows_committed_while_redis_is_down_go_out_when_it_returns(
    postgres_db: OutboxDb, private_redis_server: PrivateRedis, tmp_path: Path
):
    server = private_redis_server
    client = bus.connect(server.url)
    log = tmp_path / "relay.log"
    worker = start_relay(
        postgres_db.dsn, server.url, log, "--poll-interval", "0.1", tables=_tables_arg(postgres_db)
    )
    try:
        _fill(postgres_db, 10)
        await wait_for(lambda: _xlen_at_least(client, 10), timeout_s=15)
        # marked sent too: killed between its XADD and its reply, a round is rolled back and its
        # rows (rightly) stay pending, which is not what this test is about
        await wait_for(lambda: _pending_rows(postgres_db, 0), timeout_s=15)
        server.kill()
        _fill(postgres_db, 10, start=10)  # the relay cannot publish these yet: they stay pending
        await wait_for(lambda: _contains(log, "outage; backing off"), timeout_s=15)  # it tried, and failed
        assert postgres_db.query("SELECT count(*) FROM {outbox} WHERE status = 0") == [(10,)]
        await server.start()  # back, but empty
        await wait_for(lambda: _xlen_at_least(client, 10), timeout_s=30)
        await wait_for(lambda: _pending_rows(postgres_db, 0), timeout_s=30)
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        worker.kill()
        await client.aclose()


async def _contains(path: Path, text: str) -> bool:
    return path.exists() and text in path.read_text(errors="replace")


async def _pending_rows(db: OutboxDb, count: int) -> bool:
    return db.query("SELECT count(*) FROM {outbox} WHERE status = 0") == [(count,)]


async def _xlen_at_least(redis: bus.Redis, count: int) -> bool:
    return int(await redis.xlen("rs:{payments}:stream")) >= count
