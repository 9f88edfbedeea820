"""Fault tests: real worker processes on real Redis, killed, stopped and cut off mid-work.

Each worker is ``tests/bus/worker_proc.py`` in its own process (spawned, signalled and
reaped by ``tests/faults/procs.py``); its participant records effects in PostgreSQL (a
UNIQUE idempotency key) and appends every call to an attempts log, so the assertions count
effects instead of trusting the bus. Leases are 1 s so that a takeover happens within the
test; every wait is a bounded poll for an observable state (``eventually``), never a sleep
standing for time passing.

Invariants of docs/faults.md checked here: G2 (one effect per idempotency key), G5 (a stalled
worker's heartbeat is refused and it does not take the entry back), G6 (dead letters carry
their context) and G7 (every entry ends acknowledged, dead-lettered or pending for the
next worker; nothing silently dropped).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import msgspec
import psycopg
import pytest

import bus
from bus import Publisher
from tests.bus.worker_proc import COMMANDS, GATE_KEY, REPLIES, SCHEMA, Charge, Charged
from tests.faults.procs import Proc, Procs
from tests.helpers import dead_letters, eventually, pending

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis, pytest.mark.postgres]

LEASE_MS = 1_000
GROUP = "payments"


# --- processes ---------------------------------------------------------------------------


@dataclass
class Faults:
    """Starts worker processes (``tests/faults/procs.py``) and reads what they did (Redis
    and the participant's database)."""

    redis: bus.Redis
    redis_url: str
    pg_dsn: str
    procs: Procs

    async def start(self, consumer: str, *options: str, ready: bool = True) -> Proc:
        """Start a worker named ``consumer``; wait until it reads unless ``ready`` is false."""
        args = ("--redis-url", self.redis_url, "--pg-dsn", self.pg_dsn, "--consumer", consumer,
                "--lease-ms", str(LEASE_MS), *options)  # fmt: skip
        return await self.procs.start(consumer, *args) if ready else self.procs.spawn(consumer, *args)

    async def publish(self, order: str, **extra: Any) -> str:
        """Publish the Charge for ``order`` (idempotency key ``saga-<order>:charge``)."""
        entry = await Publisher(self.redis, source="orders").publish(
            COMMANDS,
            Charge(order=order, amount=10),
            correlation_id=f"saga-{order}",
            idempotency_key=f"saga-{order}:charge",
            reply_to=REPLIES,
            **extra,
        )
        assert entry is not None
        return entry

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        """Rows from the participant's database."""
        with psycopg.connect(self.pg_dsn, autocommit=True) as connection:
            return connection.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def effects(self) -> dict[str, str]:
        """order -> consumer that applied it."""
        return dict(self.query("SELECT order_id, consumer FROM fault_effects"))  # type: ignore[arg-type]

    def attempts(self, order: str | None = None) -> list[tuple[str, str, int, str]]:
        """(order, consumer, delivery, outcome) in the order they happened."""
        rows = self.query("SELECT order_id, consumer, delivery, outcome FROM fault_attempts ORDER BY seq")
        return [row for row in rows if order is None or row[0] == order]  # type: ignore[misc]

    async def pending(self) -> list[dict[str, object]]:
        """The group's pending entries."""
        return await pending(self.redis, COMMANDS, GROUP)

    async def nothing_pending(self) -> bool:
        """Whether the group has no pending entry."""
        return await self.pending() == []

    async def replies(self) -> list[Charged]:
        """Every reply on the inbox."""
        entries = await self.redis.xrange(REPLIES.key)
        return [bus.decode_fields(f, max_bytes=1 << 20, max_fields=32).decode(Charged) for _, f in entries]

    async def stop_all(self) -> None:
        """SIGTERM every live worker and check each drains and exits cleanly."""
        live = self.procs.running
        for proc in live:
            proc.terminate()
        for proc in live:
            assert await proc.wait_exit() == 0, proc.log_path.read_text()


@pytest.fixture
def pg_database(pg_dsn: str) -> Iterator[str]:
    """The participant's database: a schema of its own (so concurrent runs never share
    tables), created empty, reached through a DSN whose search_path points at it."""
    parsed = urlparse(pg_dsn)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as connection:
        if not connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            connection.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    schema = f"faults_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_dsn, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
    separator = "&" if parsed.query else ""
    dsn = parsed._replace(query=f"{parsed.query}{separator}options=-csearch_path%3D{schema}").geturl()
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(SCHEMA)  # type: ignore[arg-type]
    try:
        yield dsn
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]


@pytest.fixture
async def faults(
    real_redis: bus.Redis, real_redis_url: str, pg_database: str, tmp_path: Path
) -> AsyncIterator[Faults]:
    procs = Procs("tests.bus.worker_proc", tmp_path / "logs")
    try:
        yield Faults(real_redis, real_redis_url, pg_database, procs)
    finally:
        procs.kill_all()
        print(procs.tail(60))


# --- scenarios ---------------------------------------------------------------------------


@pytest.mark.parametrize("hold_at", ["before", "after"])
async def test_sigkill_mid_handler_entry_is_taken_over_after_the_lease(faults: Faults, hold_at: str) -> None:
    """(a) A consumer dies mid-handler (before, or after, its effect): another takes over.

    Killed after the effect and before recording it (fault catalogue item 1), the redelivery meets
    the participant's idempotency key and replies with the first receipt: one effect.
    """
    victim = await faults.start("victim", "--behaviour", "hold", "--hold-at", hold_at)
    await faults.publish("o1")
    expected = "started" if hold_at == "before" else "applied"
    await eventually(lambda: ("o1", "victim", 1, expected) in faults.attempts(), 10, f"victim {expected}")
    victim.kill()
    assert await victim.wait_exit() == -signal.SIGKILL

    await faults.start("rescuer")
    await eventually(faults.nothing_pending, 10, "the entry is acknowledged")

    if hold_at == "before":
        assert faults.effects() == {"o1": "rescuer"}
        assert faults.attempts() == [
            ("o1", "victim", 1, "started"),
            ("o1", "rescuer", 2, "started"),
            ("o1", "rescuer", 2, "applied"),
        ]
    else:
        assert faults.effects() == {"o1": "victim"}
        assert faults.attempts() == [
            ("o1", "victim", 1, "started"),
            ("o1", "victim", 1, "applied"),
            ("o1", "rescuer", 2, "started"),
            ("o1", "rescuer", 2, "duplicate"),
        ]
    [reply] = await faults.replies()
    assert reply.receipt == f"receipt-o1-{faults.effects()['o1']}"  # the one effect's receipt
    assert await dead_letters(faults.redis, COMMANDS) == []
    await faults.stop_all()


async def test_sigstop_past_the_lease_heartbeat_is_refused_and_entry_handled_once(faults: Faults) -> None:
    """(b) A stalled consumer wakes up after a takeover: fenced out, one effect (G5, G2).

    Either fence may fire first on SIGCONT (the refused heartbeat or the watchdog that gives
    up on a lease not renewed for too long); both end in the abandoned handler asserted here.
    """
    stalled = await faults.start("stalled", "--behaviour", "hold")
    await faults.publish("o1")
    await eventually(lambda: ("o1", "stalled", 1, "started") in faults.attempts(), 10, "stalled starts")
    stalled.stop()

    await faults.start("rescuer", "--behaviour", "hold")
    await eventually(lambda: ("o1", "rescuer", 2, "started") in faults.attempts(), 10, "rescuer takes over")
    stalled.resume()

    # fenced: it abandons the handler and leaves the entry alone
    await stalled.wait_for("handler abandoned; the entry stays pending for another consumer")
    [entry] = await faults.pending()
    assert entry["consumer"] == "rescuer"

    await faults.redis.set(GATE_KEY, 1)
    await eventually(faults.nothing_pending, 10, "the entry is acknowledged")
    assert faults.effects() == {"o1": "rescuer"}
    assert [a for a in faults.attempts() if a[3] != "started"] == [("o1", "rescuer", 2, "applied")]
    assert len(await faults.replies()) == 1
    await faults.stop_all()


async def test_poison_entry_is_dead_lettered_with_context_while_others_flow(faults: Faults) -> None:
    """(c) A handler that always raises: dead-lettered after the limit with G6's context."""
    await faults.start("w1", "--behaviour", "raise", "--poison", "bad")
    poison_id = await faults.publish("bad", headers={"step": "charge", "traceparent": "00-abc-def-01"})
    for i in range(5):
        await faults.publish(f"good{i}")

    async def settled() -> bool:
        return len(await dead_letters(faults.redis, COMMANDS)) == 1 and len(faults.effects()) == 5

    await eventually(settled, 15, "the poison entry is dead-lettered and the rest applied")
    [letter] = await dead_letters(faults.redis, COMMANDS)
    assert letter["stream"] == COMMANDS.key
    assert letter["entry"] == poison_id
    assert letter["group"] == GROUP
    assert letter["consumer"] == "w1"
    assert letter["deliveries"] == "3"
    assert letter["reason"] == "delivery limit of 3 reached"
    assert letter["correlation_id"] == "saga-bad"
    assert letter["idempotency_key"] == "saga-bad:charge"
    assert letter["header.step"] == "charge"
    assert letter["attempt"] == "1"
    errors = msgspec.json.decode(letter["errors"])
    assert (
        errors
        == ["RuntimeError: card gateway refused the charge <- ValueError: card number for bad is garbage"] * 3
    )
    assert int(letter["first_failed_ms"]) <= int(letter["last_failed_ms"])
    assert msgspec.json.decode(letter["raw.data"], type=Charge) == Charge(order="bad", amount=10)
    assert letter["raw_truncated"] == "0"
    # dead-lettered atomically with the ack: nothing pending, no second letter, history gone
    assert await faults.pending() == []
    assert await faults.redis.hlen(COMMANDS.failures_key(GROUP)) == 0
    assert [a[2] for a in faults.attempts("bad")] == [1, 2, 3]
    assert faults.effects() == {f"good{i}": "w1" for i in range(5)}
    await faults.stop_all()
    assert len(await dead_letters(faults.redis, COMMANDS)) == 1


async def test_entry_that_crashes_the_process_is_dead_lettered_after_the_limit(faults: Faults) -> None:
    """(c') The handler kills its process on every delivery; restarted workers go on."""
    await faults.publish("bad")
    goods = [f"good{i}" for i in range(6)]
    for order in goods[:3]:
        await faults.publish(order)
    options = ("--behaviour", "crash", "--poison", "bad", "--concurrency", "1")
    generation = 0

    async def supervise() -> bool:
        """Restart the worker whenever it died (what systemd or Kubernetes would do)."""
        nonlocal generation
        if not faults.procs.running:
            generation += 1
            await faults.start(f"crashy{generation}", *options, ready=False)
        return len(await dead_letters(faults.redis, COMMANDS)) == 1

    await eventually(supervise, 30, "the crashing entry is dead-lettered")
    for order in goods[3:]:  # entries published after the dead letter still flow
        await faults.publish(order)
    await eventually(lambda: len(faults.effects()) == len(goods), 10, "every other entry is applied")

    [letter] = await dead_letters(faults.redis, COMMANDS)
    assert letter["reason"].startswith("delivery limit of 3 exceeded")
    assert letter["deliveries"] == "4"  # the 4th delivery found the limit passed
    assert letter["correlation_id"] == "saga-bad"
    assert msgspec.json.decode(letter["raw.data"], type=Charge) == Charge(order="bad", amount=10)
    assert [a[2] for a in faults.attempts("bad")] == [1, 2, 3]  # three crashes, no fourth run
    assert generation >= 4
    await eventually(faults.nothing_pending, 10, "nothing is left pending")
    assert sorted(faults.effects()) == sorted(goods)
    await faults.stop_all()


async def test_malformed_entry_is_dead_lettered_at_once_and_the_worker_goes_on(faults: Faults) -> None:
    """(d) Garbage on the stream: one dead letter on the first delivery, no crash, no retry."""
    worker = await faults.start("w1")
    fields = {"e": b"\x93\x03\xa6Charge\xff", "data": b"\xff\x00"}  # three items, the last no MessagePack
    garbage = (await faults.redis.xadd(COMMANDS.key, fields)).decode()  # type: ignore[arg-type]
    await faults.publish("o1")
    await eventually(lambda: faults.effects() == {"o1": "w1"}, 10, "the good entry is applied")

    async def dead() -> bool:
        return len(await dead_letters(faults.redis, COMMANDS)) == 1

    await eventually(dead, 10, "the malformed entry is dead-lettered")
    [letter] = await dead_letters(faults.redis, COMMANDS)
    assert letter["entry"] == garbage
    assert letter["deliveries"] == "1"
    assert letter["reason"] == "malformed entry: invalid envelope field: Expected `array` of length 14, got 3"
    assert letter["raw.e"] == "\\x93\x03\\xa6Charge\\xff"  # what is not UTF-8 escaped
    assert letter["raw.data"] == "\ufffd\x00"
    assert await faults.pending() == []
    assert worker.alive
    await faults.stop_all()


async def test_sigterm_during_a_burst_loses_nothing(faults: Faults) -> None:
    """(e) SIGTERM mid-burst: in-flight work finishes, the rest waits; a new worker ends it."""
    total = 300
    orders = [f"o{i:03}" for i in range(total)]
    first = await faults.start("first", "--concurrency", "32", "--work-ms", "50")
    await Publisher(faults.redis, source="orders").publish_many(
        [
            (
                COMMANDS,
                bus.new_envelope(
                    Charge(order=order, amount=1),
                    max_bytes=1 << 20,
                    correlation_id=f"saga-{order}",
                    idempotency_key=f"saga-{order}:charge",
                ),
            )
            for order in orders
        ]
    )
    await eventually(lambda: len(faults.effects()) >= 40, 15, "the burst is under way")
    first.terminate()
    assert await first.wait_exit() == 0
    assert first.saw("worker stopped")

    done_by_first = faults.effects()
    assert 0 < len(done_by_first) < total  # the signal landed mid-burst
    started = {a[0] for a in faults.attempts() if a[1] == "first" and a[3] == "started"}
    assert started == set(done_by_first)  # every handler it started finished (graceful drain)
    assert await faults.pending() == []  # nothing it read is left behind
    # every entry is acknowledged or not yet delivered: none lost (G7)
    [info] = await faults.redis.xinfo_groups(COMMANDS.key)
    assert info["lag"] == total - len(done_by_first)

    await faults.start("second", "--concurrency", "32")
    await eventually(lambda: len(faults.effects()) == total, 20, "a new worker finishes the burst")
    assert not [a for a in faults.attempts() if a[3] == "duplicate"]
    await faults.stop_all()
    assert await faults.pending() == []
    assert await dead_letters(faults.redis, COMMANDS) == []


async def test_client_kill_mid_run_consumers_reconnect_and_continue(faults: Faults) -> None:
    """(f) Every connection of the worker is killed mid-run, three times: it reconnects and goes on.

    Each kill lands while ten handlers are in flight (their effects applied, their
    completions not yet sent) and the reader is blocked in XREADGROUP.
    """
    worker = await faults.start("w1", "--work-ms", "300")
    name = "fault-w1"  # worker_proc names its connections after the consumer

    async def connections() -> set[str]:
        return {c["id"] for c in await faults.redis.client_list() if c.get("name") == name}

    published = 0
    for _round in range(3):
        for _ in range(10):
            await faults.publish(f"o{published}")
            published += 1
        target = published
        await eventually(lambda t=target: len(faults.effects()) == t, 15, f"{target} effects applied")
        before = await connections()
        assert before
        for client_id in before:
            await faults.redis.client_kill_filter(_id=client_id)
        await eventually(faults.nothing_pending, 15, f"{target} entries acknowledged")

        async def reconnected(old: set[str] = before) -> bool:
            now = await connections()
            return bool(now) and not now & old

        await eventually(reconnected, 10, "the worker reconnects")

    assert faults.effects() == {f"o{i}": "w1" for i in range(published)}
    assert not [a for a in faults.attempts() if a[3] == "duplicate"]
    assert len(await faults.replies()) == published
    assert worker.alive
    await faults.stop_all()
    assert await dead_letters(faults.redis, COMMANDS) == []
