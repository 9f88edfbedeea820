"""The outbox relay contract: every test runs on SQLite (fakeredis) and PostgreSQL (real Redis),
and both on the test cluster (marker ``cluster``: each hash tag's publish call on its master)."""

from __future__ import annotations

import pytest

import bus
import relay
from bus.lowlevel import AFTER_XADD_BEFORE_MARK_SENT
from relay import _relay
from tests.relay.conftest import OutboxDb
from tests.relay.helpers import Charged, entries, orders

pytestmark = pytest.mark.anyio


class Crash(BaseException):
    """Stands in for SIGKILL at a crash point (the real SIGKILL runs in test_faults)."""


def add(
    db: OutboxDb, *messages: Charged, stream: str | bus.Stream = "payments", key: str | None = None
) -> list[int]:
    outbox = relay.Outbox(db.tables)
    conn = db.connect()
    try:
        ids = [outbox.add(conn, stream, m, ordering_key=key) for m in messages]
        conn.commit()
        return ids
    finally:
        conn.close()


async def drain(db: OutboxDb, redis: bus.Redis, **config: object) -> relay.Relay:
    worker = relay.Relay.connect(db.dsn, redis, config=db.config(**config))
    await worker.run(drain=True)
    return worker


async def test_rollback_adds_nothing_and_commit_adds_exactly_one_entry(
    outbox_db: OutboxDb, relay_redis: bus.Redis
):
    outbox = relay.Outbox(outbox_db.tables)
    conn = outbox_db.connect()
    outbox.add(conn, "payments", Charged(order="rolled-back"))
    conn.rollback()
    outbox.add(conn, "payments", Charged(order="committed"), correlation_id="saga-1")
    conn.commit()
    conn.close()

    worker = await drain(outbox_db, relay_redis)

    [(entry_id, envelope)] = await entries(relay_redis)
    assert envelope.decode(Charged).order == "committed"
    assert envelope.correlation_id == "saga-1"
    assert outbox_db.query("SELECT status, entry_id FROM {outbox}") == [(1, entry_id)]
    assert worker.counters.sent == 1
    await worker.run(drain=True)  # nothing left: a second pass publishes nothing
    assert len(await entries(relay_redis)) == 1


async def test_rows_published_before_a_crash_are_not_published_again(
    outbox_db: OutboxDb, relay_redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
):
    add(outbox_db, *(Charged(order=f"o{i}") for i in range(5)))

    def crash(name: str) -> None:
        if name == AFTER_XADD_BEFORE_MARK_SENT:
            raise Crash

    monkeypatch.setattr(_relay, "crash_point", crash)
    with pytest.raises(Crash):
        await drain(outbox_db, relay_redis)
    assert await orders(relay_redis) == [f"o{i}" for i in range(5)]
    assert outbox_db.query("SELECT count(*) FROM {outbox} WHERE status = 0") == [(5,)]

    monkeypatch.undo()
    worker = await drain(outbox_db, relay_redis)

    assert await orders(relay_redis) == [f"o{i}" for i in range(5)]  # no duplicate entry
    assert (worker.counters.sent, worker.counters.repeats) == (0, 5)
    assert outbox_db.query("SELECT count(*) FROM {outbox} WHERE status = 1 AND entry_id IS NULL") == [(5,)]


async def test_unpublishable_rows_fail_with_a_reason_and_do_not_block_others(
    outbox_db: OutboxDb, relay_redis: bus.Redis
):
    await relay_redis.set(bus.Stream.named("wrongtype").key, "not a stream")
    [first] = add(outbox_db, Charged(order="first"))
    [bad_key] = add(outbox_db, Charged(order="bad-key"))
    outbox_db.query("UPDATE {outbox} SET stream = 'not-a-stream-key' WHERE id = ?", (bad_key,))
    [corrupt] = add(outbox_db, Charged(order="corrupt"))
    outbox_db.query("UPDATE {outbox} SET envelope = ? WHERE id = ?", (b"\x01\x02", corrupt))
    [big] = add(outbox_db, Charged(order="big", note="x" * 5000))
    [wrongtype] = add(outbox_db, Charged(order="wrongtype"), stream="wrongtype", key="k")
    [same_key] = add(outbox_db, Charged(order="same-key"), key="k")
    [last] = add(outbox_db, Charged(order="last"))

    worker = await drain(outbox_db, relay_redis, max_entry_bytes=2000)

    # "same-key" waited one round behind its key's row in another tag, which then failed.
    assert await orders(relay_redis) == ["first", "last", "same-key"]
    failed = {row.id: row.error for row in await _failed(outbox_db, relay_redis)}
    assert set(failed) == {bad_key, corrupt, big, wrongtype}
    assert "invalid stream key" in failed[bad_key]
    assert "no valid envelope" in failed[corrupt]
    assert "oversized" in failed[big]
    assert "not a stream" in failed[wrongtype]
    assert worker.counters.failed == 4
    assert {row[0] for row in outbox_db.query("SELECT id FROM {outbox} WHERE status = 1")} == {
        first,
        same_key,
        last,
    }
    stats = await relay.outbox_stats(outbox_db.dsn, tables=outbox_db.tables)
    assert (stats.backlog, stats.failed) == (0, 4)

    # Fix the cause, requeue, and the row goes out.
    await relay_redis.delete(bus.Stream.named("wrongtype").key)
    requeuer = relay.Relay.connect(outbox_db.dsn, relay_redis, config=outbox_db.config())
    assert await requeuer.requeue([wrongtype, first]) == 1  # only failed rows are requeued
    await requeuer.close()
    await drain(outbox_db, relay_redis)
    assert [
        e.decode(Charged).order for _, e in await entries(relay_redis, bus.Stream.named("wrongtype"))
    ] == ["wrongtype"]


async def _failed(db: OutboxDb, redis: bus.Redis) -> list[relay.FailedRow]:
    worker = relay.Relay.connect(db.dsn, redis, config=db.config())
    try:
        return await worker.failed_rows()
    finally:
        await worker.close()


async def test_unknown_streams_are_failed_when_streams_must_exist_or_be_listed(
    outbox_db: OutboxDb, relay_redis: bus.Redis
):
    known = bus.Stream.named("known")
    await relay_redis.xgroup_create(known.key, "g", id="$", mkstream=True)
    [unknown] = add(outbox_db, Charged(order="u"), stream="unknown")
    add(outbox_db, Charged(order="k"), stream=known)

    await drain(outbox_db, relay_redis, create_streams=False)
    [row] = await _failed(outbox_db, relay_redis)
    assert (row.id, "unknown stream" in row.error) == (unknown, True)
    assert await orders(relay_redis, known) == ["k"]

    [other] = add(outbox_db, Charged(order="other"), stream="other")
    add(outbox_db, Charged(order="k2"), stream=known)
    await drain(outbox_db, relay_redis, streams=frozenset({known.key}))
    assert other in {r.id for r in await _failed(outbox_db, relay_redis)}
    assert await orders(relay_redis, known) == ["k", "k2"]


async def test_rows_of_one_key_keep_their_order_across_hash_tags(outbox_db: OutboxDb, relay_redis: bus.Redis):
    x, y = bus.Stream.named("x"), bus.Stream.named("y")
    add(outbox_db, Charged(order="a"), stream=x, key="saga-1")
    add(outbox_db, Charged(order="b"), stream=y, key="saga-1")
    add(outbox_db, Charged(order="c"), stream=x, key="saga-1")
    add(outbox_db, Charged(order="d"), stream=y)
    worker = relay.Relay.connect(outbox_db.dsn, relay_redis, config=outbox_db.config())
    try:
        await worker.store.open()
        # The key's rows in another tag wait: two calls could fail apart and reorder them.
        assert (await worker.step()).claimed == 4
        assert (await orders(relay_redis, x), await orders(relay_redis, y)) == (["a"], ["d"])
        await worker.step()
        assert (await orders(relay_redis, x), await orders(relay_redis, y)) == (["a"], ["d", "b"])
        await worker.step()
        assert (await orders(relay_redis, x), await orders(relay_redis, y)) == (["a", "c"], ["d", "b"])
    finally:
        await worker.close()


@pytest.mark.parametrize("mode", ["delete", "archive"])
async def test_retention_removes_old_sent_rows_and_inbox_keys(
    outbox_db: OutboxDb, relay_redis: bus.Redis, mode: str
):
    clock = bus.FakeClock()
    add(outbox_db, Charged(order="old"))
    config = outbox_db.config(retention_s=3600, inbox_retention_s=86_400, retention_mode=mode)
    worker = relay.Relay(
        relay.Relay.connect(outbox_db.dsn, relay_redis, config=config).store,
        relay_redis,
        config=config,
        clock=clock,
    )
    await worker.store.open()
    try:
        await worker.step()
        command = bus.new_envelope(Charged(order="cmd"), max_bytes=1 << 20, now_ms=clock.now_ms())
        conn = outbox_db.connect()
        relay.Inbox(outbox_db.tables, clock=clock).receive(conn, "payments", command)
        conn.commit()
        conn.close()
        add(outbox_db, Charged(order="pending"))

        clock.advance(3599)
        assert await worker.purge() == 0
        clock.advance(2)
        assert await worker.purge() == 1  # the sent row; the pending row stays
        assert outbox_db.query("SELECT count(*) FROM {outbox}") == [(1,)]
        archived = outbox_db.query("SELECT count(*) FROM {archive}")
        assert archived == [(1 if mode == "archive" else 0,)]
        clock.advance(86_400)
        assert await worker.purge() == 1  # the inbox key
        assert outbox_db.query("SELECT count(*) FROM {inbox}") == [(0,)]
    finally:
        await worker.close()


async def test_stats_report_the_backlog_and_the_oldest_unsent_age(
    outbox_db: OutboxDb, relay_redis: bus.Redis
):
    clock = bus.FakeClock()
    outbox = relay.Outbox(outbox_db.tables, clock=clock)
    conn = outbox_db.connect()
    outbox.add(conn, "payments", Charged(order="a"))
    clock.advance(2)
    outbox.add(conn, "payments", Charged(order="b"))
    conn.commit()
    conn.close()

    stats = await relay.outbox_stats(outbox_db.dsn, tables=outbox_db.tables, now_ms=clock.now_ms() + 500)
    assert stats == relay.OutboxStats(
        backlog=2, oldest_unsent_age_ms=2500, failed=0, checked_at_ms=clock.now_ms() + 500
    )
    await drain(outbox_db, relay_redis)
    stats = await relay.outbox_stats(outbox_db.dsn, tables=outbox_db.tables)
    assert (stats.backlog, stats.oldest_unsent_age_ms) == (0, None)


async def test_init_db_is_idempotent_and_a_missing_schema_is_reported(
    outbox_db: OutboxDb, relay_redis: bus.Redis
):
    assert await relay.init_db(outbox_db.dsn, outbox_db.tables) == []
    missing = relay.Tables.prefixed("never_created")
    worker = relay.Relay.connect(outbox_db.dsn, relay_redis, config=relay.RelayConfig(tables=missing))
    with pytest.raises(relay.SchemaMissing, match="saga relay init-db"):
        await worker.run(drain=True)


async def test_inbox_applies_a_command_once_and_resends_the_first_reply(
    outbox_db: OutboxDb, relay_redis: bus.Redis
):
    replies = bus.Stream("orders:0", "inbox")
    outbox_db.query("CREATE TABLE ledger_{outbox} (order_id text PRIMARY KEY, amount integer)")
    inbox = relay.Inbox(outbox_db.tables)

    def handle(command: bus.Envelope) -> bool:
        """The participant's handler: business change, inbox key and reply in one transaction."""
        conn = outbox_db.connect()
        try:
            received = inbox.receive(conn, "payments", command)
            if received.duplicate:
                inbox.resend(conn, received)
            else:
                order = command.decode(Charged).order
                conn.execute(
                    f"INSERT INTO ledger_{outbox_db.tables.outbox} VALUES ({_p(outbox_db)}, 10)", (order,)
                )
                inbox.reply(conn, received, Charged(order=order, note="charged"))
            conn.commit()
            return received.duplicate
        finally:
            conn.close()

    def command(message_id: str | None = None) -> bus.Envelope:
        return bus.new_envelope(
            Charged(order="o1"),
            max_bytes=1 << 20,
            correlation_id="saga-1",
            idempotency_key="saga-1:charge",
            reply_to=replies.key,
            message_id=message_id,
        )

    first = command()
    assert handle(first) is False
    assert handle(first) is True  # the same entry redelivered
    retried = command()  # the orchestrator retried: new id, same idempotency key
    assert handle(retried) is True
    await drain(outbox_db, relay_redis)

    assert outbox_db.query("SELECT count(*) FROM ledger_{outbox}") == [(1,)]  # charged once
    sent = [envelope for _, envelope in await entries(relay_redis, replies)]
    # One reply per distinct command: the redelivery's resend was deduped by its derived id.
    assert [e.causation_id for e in sent] == [first.id, retried.id]
    assert [e.decode(Charged) for e in sent] == [Charged(order="o1", note="charged")] * 2
    assert {e.correlation_id for e in sent} == {"saga-1"}

    conn = outbox_db.connect()
    again = inbox.receive(conn, "payments", retried)
    conn.rollback()
    conn.close()
    assert again.duplicate
    assert again.first_message_id == first.id
    assert again.reply(Charged) == Charged(order="o1", note="charged")


def _p(db: OutboxDb) -> str:
    return "?" if db.dialect == "sqlite" else "%s"
