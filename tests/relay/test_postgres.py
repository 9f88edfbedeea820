"""PostgreSQL-only behaviour: out-of-order commits, several relays, NOTIFY wake-ups, locking."""

from __future__ import annotations

import random
import threading

import anyio
import psycopg
import pytest

import bus
import relay
from tests.relay.conftest import OutboxDb
from tests.relay.helpers import Charged, entries, orders, wait_for

pytestmark = pytest.mark.anyio


@pytest.fixture
async def redis(postgres_db: OutboxDb, real_redis: bus.Redis) -> bus.Redis:
    return real_redis


async def test_a_row_that_commits_after_a_higher_id_was_published_is_not_skipped(
    postgres_db: OutboxDb, redis: bus.Redis
):
    outbox = relay.Outbox(postgres_db.tables)
    late = psycopg.connect(postgres_db.dsn)
    early = psycopg.connect(postgres_db.dsn)
    worker = relay.Relay.connect(postgres_db.dsn, redis, config=postgres_db.config())
    try:
        late_id = outbox.add(late, "payments", Charged(order="late"))  # takes the lower id, stays open
        early_id = outbox.add(early, "payments", Charged(order="early"))
        early.commit()
        assert late_id < early_id

        await worker.run(drain=True)
        assert await orders(redis) == ["early"]  # the higher id went out first

        late.commit()  # the lower id commits only now
        await worker.run(drain=True)
        assert await orders(redis) == ["early", "late"]  # found, published once
        rows = postgres_db.query("SELECT id, status FROM {outbox} ORDER BY id")
        assert rows == [(late_id, 1), (early_id, 1)]
    finally:
        late.close()
        early.close()


async def test_a_running_relay_picks_up_a_late_lower_id_on_notify(postgres_db: OutboxDb, redis: bus.Redis):
    outbox = relay.Outbox(postgres_db.tables)
    # The poll interval is far beyond the test's deadline: only NOTIFY can wake the relay.
    worker = relay.Relay.connect(postgres_db.dsn, redis, config=postgres_db.config(poll_interval_s=60))
    late = psycopg.connect(postgres_db.dsn)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(worker.run)
            outbox.add(late, "payments", Charged(order="late"))
            with psycopg.connect(postgres_db.dsn) as conn:
                outbox.add(conn, "payments", Charged(order="early"))
            await wait_for(lambda: _count_is(redis, 1))
            late.commit()
            await wait_for(lambda: _count_is(redis, 2))
            worker.stop()
        assert await orders(redis) == ["early", "late"]
    finally:
        late.close()


async def test_two_relays_publish_every_row_once_and_each_key_in_order(
    postgres_db: OutboxDb, redis: bus.Redis
):
    rng = random.Random(7)
    outbox = relay.Outbox(postgres_db.tables)
    expected: dict[str, list[str]] = {}
    with psycopg.connect(postgres_db.dsn) as conn:
        for i in range(1500):
            key = f"saga-{rng.randrange(30)}"
            outbox.add(conn, "payments", Charged(order=f"{key}/{i}", seq=i), ordering_key=key)
            expected.setdefault(key, []).append(f"{key}/{i}")
            if i % 100 == 99:
                conn.commit()
    config = postgres_db.config(batch_size=50)
    first = relay.Relay.connect(postgres_db.dsn, redis, config=config)
    second = relay.Relay.connect(postgres_db.dsn, redis, config=config)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(lambda: first.run(drain=True))
        tasks.start_soon(lambda: second.run(drain=True))

    published = await orders(redis)
    assert len(published) == len(set(published)) == 1500
    by_key: dict[str, list[str]] = {}
    for order in published:
        by_key.setdefault(order.split("/")[0], []).append(order)
    assert by_key == expected
    assert first.counters.sent > 0
    assert second.counters.sent > 0  # both relays did work
    assert first.counters.sent + second.counters.sent == 1500


async def test_writers_of_one_key_get_ids_in_commit_order(postgres_db: OutboxDb, redis: bus.Redis):
    """Same-key writers queue on an advisory lock, so ids of a key follow commit order."""
    outbox = relay.Outbox(postgres_db.tables)
    holder = psycopg.connect(postgres_db.dsn)
    outbox.add(holder, "payments", Charged(order="first"), ordering_key="saga-1")
    second_done = threading.Event()

    def second_writer() -> None:
        with psycopg.connect(postgres_db.dsn) as conn:
            outbox.add(conn, "payments", Charged(order="second"), ordering_key="saga-1")
        second_done.set()

    thread = threading.Thread(target=second_writer)
    thread.start()
    try:
        assert not second_done.wait(0.3)  # queued behind the open transaction of the same key
        with psycopg.connect(postgres_db.dsn) as other:  # other keys are not held up
            outbox.add(other, "payments", Charged(order="other"), ordering_key="saga-2")
        holder.commit()
        thread.join(5)
        assert second_done.is_set()
    finally:
        holder.close()
    await relay.Relay.connect(postgres_db.dsn, redis, config=postgres_db.config()).run(drain=True)
    assert [o for o in await orders(redis) if o != "other"] == ["first", "second"]


async def test_concurrent_deliveries_of_one_key_apply_once(postgres_db: OutboxDb):
    inbox = relay.Inbox(postgres_db.tables)
    command = bus.new_envelope(Charged(order="o1"), max_bytes=1 << 20, idempotency_key="saga-1:charge")
    first = psycopg.connect(postgres_db.dsn)
    results: list[bool] = []

    def second_delivery() -> None:
        with psycopg.connect(postgres_db.dsn) as conn:
            results.append(inbox.receive(conn, "payments", command).duplicate)

    try:
        assert inbox.receive(first, "payments", command).duplicate is False
        thread = threading.Thread(target=second_delivery)
        thread.start()
        await wait_for(lambda: _someone_waits_on_a_lock(postgres_db.dsn), timeout_s=10)
        assert results == []  # the second delivery queues behind the first transaction's key
        first.commit()
        thread.join(5)
    finally:
        first.close()
    assert results == [True]


async def _someone_waits_on_a_lock(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()
    return bool(row and row[0])


async def test_stop_lets_the_round_in_flight_finish(postgres_db: OutboxDb, redis: bus.Redis):
    with psycopg.connect(postgres_db.dsn) as conn:
        for i in range(20):
            relay.Outbox(postgres_db.tables).add(conn, "payments", Charged(order=f"o{i}"))
    worker = relay.Relay.connect(postgres_db.dsn, redis, config=postgres_db.config(batch_size=5))
    worker.stop()  # asked to stop before it starts: runs no round
    await worker.run()
    assert await entries(redis) == []
    assert worker.counters.rounds == 0


async def _count_is(redis: bus.Redis, count: int) -> bool:
    return int(await redis.xlen(bus.Stream.named("payments").key)) == count
