"""Redis refusing writes: for now (maxmemory, catalogue item 12) or for good (an ACL permission)."""

from __future__ import annotations

import pytest

import bus
import relay
from tests.relay.conftest import OutboxDb
from tests.relay.helpers import Charged

pytestmark = [pytest.mark.anyio, pytest.mark.faults]


async def test_rows_stay_pending_while_redis_refuses_writes_and_drain_after(
    outbox_db: OutboxDb, private_redis: bus.Redis
):
    redis = private_redis
    await redis.set("ballast", "x" * 2_000_000)
    used = int((await redis.info("memory"))["used_memory"])
    # well below what is used now (noeviction: nothing is evicted, every write is refused):
    # "just above" made the test depend on how much a new connection's buffers happen to add,
    # and 100 kB below was not always below by the time the relay wrote, on a loaded machine
    await redis.config_set("maxmemory", used // 2)

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


async def test_rows_redis_refuses_for_good_fail_with_the_reason_and_others_flow(
    outbox_db: OutboxDb, private_redis: bus.Redis, private_redis_url: str
):
    # A relay user allowed every command, but only the keys of the "payments" tag.
    await private_redis.execute_command(
        "ACL", "SETUSER", "relay", "on", ">secret", "~rs:{payments}:*", "+@all"
    )
    limited = bus.connect(private_redis_url.replace("redis://", "redis://relay:secret@"))
    outbox = relay.Outbox(outbox_db.tables)
    conn = outbox_db.connect()
    denied = outbox.add(conn, "audit", Charged(order="denied"))
    allowed = outbox.add(conn, "payments", Charged(order="allowed"))
    conn.commit()
    conn.close()
    worker = relay.Relay.connect(outbox_db.dsn, limited, config=outbox_db.config())
    try:
        await worker.run(drain=True)
        [failed] = await worker.failed_rows()
    finally:
        await worker.close()
        await limited.aclose()
    assert failed.id == denied
    assert "NOPERM" in failed.error or "permission" in failed.error.lower()
    assert outbox_db.query("SELECT status FROM {outbox} WHERE id = ?", (allowed,)) == [(1,)]
    assert await private_redis.xlen(bus.Stream.named("payments").key) == 1
