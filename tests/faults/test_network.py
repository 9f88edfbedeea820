"""Network faults between redsaga and Redis, injected by the loopback proxy (tests/faults/proxy.py).

- Ambiguous writes (docs/faults.md, "redis-py retries writes"; docs/guarantees.md, "every
  write is safe to repeat"): the reply of one write is swallowed and the connection closed, so redis-py
  re-sends a command the server already ran. One case per write path; each must change
  nothing the second time: one stream entry per message id, one transition per event, one
  effect per idempotency key, nothing left pending. The same for the bus's failure record
  and batch publish, and the relay's publish of outbox rows.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import msgspec
import pytest

import bus
import relay
from bus import Bus, Delivery, FakeClock, Worker
from bus._lua import COMPLETE_BATCH, FAIL, HEARTBEAT, PUBLISH, PUBLISH_BATCH, READ_CLAIM
from bus._scripts import Script, load_libraries
from relay._publish import PUBLISH_ROWS
from saga import (
    App,
    EngineConfig,
    SagaClient,
    SagaStatus,
    SagaWorker,
    Schedule,
    ScheduleClient,
    run_migration,
)
from saga.core.model import Migrated
from saga.errors import ScheduleExists
from saga.store.keys import Partition
from saga.store.redis_store import RedisStore
from saga.store.scripts import FIRE_TIMERS, MIGRATE, SCHEDULE_WRITE, TRANSITION
from saga.testing import decode_history
from tests.bus.test_contract import COMMANDS, Charge, Charged, payments_app, publish_charge, replies
from tests.bus.test_contract import CONFIG as CONTRACT
from tests.faults.net_app import NET, STEPS, Approval, Order, app
from tests.faults.proxy import FaultProxy, Mode
from tests.faults.servers import PrivateRedis
from tests.helpers import age_pending, dead_letters, envelope_items, pending
from tests.relay.conftest import OutboxDb, in_thread
from tests.relay.conftest import _drop_pg_tables as drop_pg_tables
from tests.relay.helpers import PAYMENTS
from tests.relay.helpers import Charged as RowCharged
from tests.saga.test_migration import sagas_in_flight
from tests.saga.versioned import v1_to_v2

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]

LEASE_MS = 2_000
CONFIG = EngineConfig(
    bus=bus.BusConfig(lease_ms=LEASE_MS, reclaim_interval_ms=200, block_ms=200, retry_base_ms=50),
    timer_poll_ms=50,
)
CLIENT = bus.ClientConfig(socket_timeout_s=1.0, retries=3)
PARTITION = Partition(NET.name, 0)


@asynccontextmanager
async def worker(
    redis: bus.Redis, application: App, config: EngineConfig = CONFIG
) -> AsyncIterator[SagaWorker]:
    """A saga worker running in this event loop until the block ends."""
    running = SagaWorker(redis, application, config=config)
    async with anyio.create_task_group() as group:
        group.start_soon(running.run)
        try:
            yield running
        finally:
            running.stop()


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20) -> None:
    """Poll an observable state until ``check`` holds (bounded)."""
    with anyio.fail_after(timeout_s):
        while not await check():
            await anyio.sleep(0.02)  # polling an observable state, not waiting for time


async def approve(client: SagaClient, order_id: str) -> None:
    """Deliver the saga's signal once it waits for it."""

    async def token() -> str | None:
        wait = (await client.query(order_id)).wait
        return wait.token if wait is not None else None

    async def waiting() -> bool:
        return await token() is not None

    await until(waiting)
    resume = await token()
    assert resume is not None
    await client.signal(resume, Approval(by="test"))


async def ended(client: SagaClient, *order_ids: str) -> None:
    """Wait until every one of the sagas ended."""

    async def check() -> bool:
        return all([(await client.get(order_id)).status.terminal for order_id in order_ids])

    await until(check)


async def drive(client: SagaClient, order_id: str) -> None:
    """Start the saga, deliver its signal once it waits, and wait for its end."""
    await client.start("net", Order(id=order_id), saga_id=order_id)
    await approve(client, order_id)
    await ended(client, order_id)


async def entry_ids(redis: bus.Redis, stream: bus.Stream) -> list[str]:
    """The message ids of every entry of ``stream``."""
    return [envelope_items(fields)["id"] for _, fields in await redis.xrange(stream.key)]


async def check_applied_once(redis: bus.Redis, *order_ids: str) -> None:
    """G1, G2, G4, G7 for sagas of the net app (the only ones in the database) after a fault."""
    client = SagaClient(redis, app(redis).registry)
    for order_id in order_ids:
        assert (await client.get(order_id)).status == SagaStatus.COMPLETED
        history = await RedisStore(redis, ttl_ms=0, cap=0).history(PARTITION, order_id)
        revisions = [entry.revision for entry in history]
        assert revisions == sorted(set(revisions)), "a transition was applied twice"
        assert [entry.ignored for entry in history if entry.ignored] == []
    effects = [e.decode() for e in await redis.lrange("test:effects", 0, -1)]
    assert sorted(effects) == sorted(f"{order_id}:{step}:do" for order_id in order_ids for step in STEPS)
    for stream in (PARTITION.inbox, PARTITION.commands("netpay")):
        ids = await entry_ids(redis, stream)
        assert len(ids) == len(set(ids)), f"a message was added twice to {stream.key}"
    assert len(await entry_ids(redis, PARTITION.commands("netpay"))) == len(STEPS) * len(order_ids)

    async def nothing_pending() -> bool:
        for stream in (PARTITION.inbox, PARTITION.commands("netpay")):
            for group in await redis.xinfo_groups(stream.key):
                if (await redis.xpending(stream.key, group["name"]))["pending"]:
                    return False
        return True

    await until(nothing_pending)


@dataclass(frozen=True)
class Swallow:
    """Swallow the reply to the next request containing ``match`` (and ``reply``, if given)."""

    match: bytes
    reply: bytes | None = None
    script: Script | None = None  # its library loaded first: else "function not found" is swallowed


@dataclass(frozen=True)
class Case:
    """One write path: the requests whose replies are swallowed (in turn), and how the saga runs."""

    faults: tuple[Swallow, ...]
    client_via_proxy: bool = False  # start and signal through the faulty link too
    hold_charge: bool = False  # keep the charge handler in flight until the faults fired


def called(which: Script) -> bytes:
    """What only an ``FCALL`` of ``which`` sends (the name as a whole RESP argument)."""
    return f"{which.function}\r\n".encode()


def script(which: Script) -> Swallow:
    """Swallow the reply to the next call of ``which``."""
    return Swallow(called(which), script=which)


CASES = {
    "saga start": Case((script(TRANSITION),), client_via_proxy=True),
    "transition commit": Case((script(TRANSITION),)),
    # a lost reply to the read that claims leaves its entries pending, each key claimed for its
    # very entry: the reclaimer takes them once the lease expired and claims them again
    "idempotency claim": Case((script(READ_CLAIM),)),
    "fenced complete": Case((script(COMPLETE_BATCH),)),
    "heartbeat": Case((script(HEARTBEAT),), hold_charge=True),
    "timer firing": Case((script(FIRE_TIMERS),)),
    "signal delivery": Case((script(PUBLISH),), client_via_proxy=True),
    # a lost XREADGROUP reply leaves the entries it handed out pending, unseen: the reclaimer
    # takes them once the lease expired (and its own lost reply is the same case again)
    "read and reclaim": Case((Swallow(b"XREADGROUP"), Swallow(b"XAUTOCLAIM", reply=b"data"))),
}


async def inject(proxy: FaultProxy, redis: bus.Redis, faults: tuple[Swallow, ...]) -> None:
    """Arm each fault once the previous one fired."""
    for number, fault in enumerate(faults, start=1):
        if fault.script is not None:
            await load_libraries(redis, [fault.script.library])
        proxy.set_mode(Mode.SWALLOW_REPLY, match=fault.match, reply_match=fault.reply, times=1)
        await until(lambda n=number: _swallowed(proxy, n))  # type: ignore[misc]


async def _swallowed(proxy: FaultProxy, count: int = 1) -> bool:
    return proxy.counters.swallowed >= count


@pytest.mark.parametrize("name", list(CASES))
async def test_a_write_whose_reply_is_lost_changes_nothing_when_re_sent(
    name: str, real_redis: bus.Redis, real_redis_url: str
) -> None:
    case = CASES[name]
    order_id = f"order-{name.replace(' ', '-')}"
    async with FaultProxy.to_url(real_redis_url) as proxy:
        proxied = bus.connect(proxy.url(real_redis_url), CLIENT)

        async def hold() -> None:
            if case.hold_charge:
                await until(lambda: _swallowed(proxy, len(case.faults)))

        application = app(real_redis, hold=hold)
        client = SagaClient(proxied if case.client_via_proxy else real_redis, application.registry)
        try:
            async with anyio.create_task_group() as faults:
                faults.start_soon(inject, proxy, real_redis, case.faults)
                async with worker(proxied, application):
                    await drive(client, order_id)
        finally:
            await proxied.aclose()
        assert proxy.counters.swallowed == len(case.faults), "a fault never fired: the path was not exercised"
    await check_applied_once(real_redis, order_id)


@asynccontextmanager
async def swallowing(url: str, *faults: Swallow) -> AsyncIterator[tuple[FaultProxy, bus.Redis]]:
    """A proxy to ``url`` swallowing the reply to each of ``faults`` once, and a client through it."""
    async with FaultProxy.to_url(url) as proxy:
        direct = bus.connect(url)
        proxied = bus.connect(proxy.url(url), CLIENT)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(inject, proxy, direct, faults)
                yield proxy, proxied
        finally:
            await proxied.aclose()
            await direct.aclose()
        assert proxy.counters.swallowed == len(faults), "a fault never fired: the path was not exercised"


async def test_a_failure_record_re_sent_records_each_failure_once(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    """fail.lua re-sent (retry, then dead): the dead letter's error chain has one link per delivery.

    Each delivery's fail call has its reply swallowed once. The swallow is armed before each
    pass rather than by a poller once the previous one fired: a pass takes a few
    milliseconds, and a poller that armed late let the dead-lettering call through.
    """
    limit = CONTRACT.max_deliveries
    await load_libraries(real_redis, [FAIL.library])  # else "function not found" would be swallowed
    async with FaultProxy.to_url(real_redis_url) as proxy:
        proxied = bus.connect(proxy.url(real_redis_url), CLIENT)
        try:
            worker = Worker(proxied, payments_app([], fail_times=100), config=CONTRACT)
            await worker.setup()
            await publish_charge(real_redis, "o1")
            for delivery in range(1, limit + 1):
                proxy.set_mode(Mode.SWALLOW_REPLY, match=called(FAIL), times=1)
                await worker.run_until_idle()  # returns once the re-sent call got its reply
                assert proxy.counters.swallowed == delivery
                for entry in await pending(real_redis, COMMANDS, "payments"):
                    await age_pending(real_redis, COMMANDS, "payments", str(entry["id"]), CONTRACT.lease_ms)
        finally:
            await proxied.aclose()
    assert await pending(real_redis, COMMANDS, "payments") == []
    [letter] = await dead_letters(real_redis, COMMANDS)
    assert msgspec.json.decode(letter["errors"]) == ["RuntimeError: gateway timeout"] * limit


async def test_a_batch_publish_re_sent_adds_each_message_once(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    async with swallowing(real_redis_url, script(PUBLISH_BATCH)) as (_, proxied):
        envelopes = [
            (COMMANDS, bus.Envelope(id=f"m{n}", type="Charge", payload=b"{}", source="test", created_at_ms=0))
            for n in range(5)
        ]
        ids = await bus.Publisher(proxied, source="test").publish_many(envelopes)
    assert ids == [None] * 5  # the re-sent batch found every id published by the first
    assert await entry_ids(real_redis, COMMANDS) == [f"m{n}" for n in range(5)]


@pytest.fixture
def sqlite_db(tmp_path: Path) -> OutboxDb:
    """An SQLite outbox (tests/relay's fixture of that name lives in its own conftest)."""
    db = OutboxDb("sqlite", f"sqlite:///{tmp_path / 'outbox.db'}", relay.Tables())
    in_thread(relay.init_db, db.dsn, db.tables)
    return db


async def test_a_relay_publish_re_sent_adds_each_row_once(
    sqlite_db: OutboxDb, real_redis: bus.Redis, real_redis_url: str
) -> None:
    outbox = relay.Outbox(sqlite_db.tables)
    conn = sqlite_db.connect()
    for n in range(20):
        outbox.add(conn, "payments", RowCharged(order=f"o{n}", seq=n))
    conn.commit()
    conn.close()
    async with swallowing(real_redis_url, script(PUBLISH_ROWS)) as (_, proxied):
        await relay.Relay.connect(sqlite_db.dsn, proxied, config=sqlite_db.config()).run(drain=True)
    published = await entry_ids(real_redis, PAYMENTS)
    assert len(published) == len(set(published)) == 20
    assert sqlite_db.query("SELECT DISTINCT status FROM {outbox}") == [(1,)]  # every row marked sent


async def test_blackholed_link_the_worker_abandons_its_lease_before_another_takes_it(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    """Catalogue item 10: a link that eats every packet (G2, G5, G7).

    The stalled worker's calls fail within their socket timeout; its heartbeats cannot get
    through, so it cancels its handler before the lease can expire: the rescuer, which
    takes the entry over once the lease expired, finds no one else still running it. After
    the heal the stalled worker works again, and its late completion changes nothing.
    """
    config = bus.BusConfig(lease_ms=LEASE_MS, reclaim_interval_ms=200, block_ms=200)
    events: list[str] = []
    started = anyio.Event()
    app = Bus("payments")

    @app.handler(COMMANDS, Charge)
    async def charge(command: Charge, delivery: Delivery) -> Charged:
        who = delivery.consumer
        events.append(f"{who} runs {command.order}")
        if who == "stalled" and command.order == "o1":
            started.set()
            try:
                await anyio.Event().wait()  # runs until its lease is given up
            except anyio.get_cancelled_exc_class():
                events.append(f"{who} abandons {command.order}")
                raise
        events.append(f"{who} applies {command.order}")
        return Charged(order=command.order, receipt=who)

    async with FaultProxy.to_url(real_redis_url) as proxy:
        proxied = bus.connect(proxy.url(real_redis_url), bus.ClientConfig(socket_timeout_s=0.5, retries=1))
        stalled = Worker(proxied, app, config=config, consumer="stalled")
        rescuer = Worker(real_redis, app, config=config, consumer="rescuer")
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(stalled.run)
                await stalled.started.wait()
                await publish_charge(real_redis, "o1")
                with anyio.fail_after(10):
                    await started.wait()
                proxy.set_mode(Mode.BLACKHOLE)
                with anyio.fail_after(5), pytest.raises(bus.BusError):  # bounded by the socket timeout
                    await bus.Publisher(proxied, source="test").publish(COMMANDS, Charge(order="x", amount=1))
                group.start_soon(rescuer.run)
                await until(lambda: _has(events, "rescuer applies o1"))
                rescuer.stop()
                await until(rescuer_stopped(rescuer))
                proxy.set_mode(Mode.PASS)
                await publish_charge(real_redis, "o2")
                await until(lambda: _has(events, "stalled applies o2"))
                stalled.stop()
        finally:
            await proxied.aclose()
        assert proxy.counters.dropped_bytes > 0
    assert events.index("stalled abandons o1") < events.index("rescuer runs o1")
    assert [e for e in events if "applies" in e] == ["rescuer applies o1", "stalled applies o2"]
    assert await pending(real_redis, COMMANDS, "payments") == []
    receipts = [envelope.decode(Charged).receipt for envelope in await replies(real_redis)]
    assert receipts == ["rescuer", "stalled"]  # one reply each: the abandoned run replied nothing


async def _has(events: list[str], event: str) -> bool:
    return event in events


def rescuer_stopped(worker: Worker) -> Callable[[], Awaitable[bool]]:
    """Whether ``worker`` finished its run (its slots are all free)."""

    async def check() -> bool:
        return worker.runtime.slots.busy == 0

    return check


async def test_latency_and_server_pauses_cause_no_spurious_reclaim(tmp_path: Path) -> None:
    """Catalogue item 11: a slow, jittery link, ``CLIENT PAUSE 3000 WRITE`` and ``DEBUG SLEEP 3``.

    The lease (10 s) outlasts each pause plus a heartbeat period, so heartbeats get through
    and no entry is reclaimed: every handler runs once, every saga ends with one effect
    per step (G1, G2, G4). The charge handlers stay in flight across both pauses.
    """
    server = PrivateRedis(tmp_path / "redis", options=("--enable-debug-command", "local"))
    await server.start()
    direct = bus.connect(server.url)
    config = EngineConfig(bus=bus.BusConfig(lease_ms=10_000, reclaim_interval_ms=200, block_ms=200))
    order_ids = [f"order-{n}" for n in range(10)]
    in_flight: list[str] = []
    paused = anyio.Event()

    async def hold() -> None:
        in_flight.append("charge")
        await paused.wait()

    application = app(direct, hold=hold)
    client = SagaClient(direct, application.registry)
    try:
        async with FaultProxy.to_url(server.url, seed=11) as proxy:
            proxy.set_mode(Mode.DELAY, delay_s=0.002, jitter_s=0.02)
            proxied = bus.connect(proxy.url(server.url))  # socket timeout 5 s > each pause
            try:
                async with worker(proxied, application, config):
                    for order_id in order_ids:
                        await client.start("net", Order(id=order_id), saga_id=order_id)
                    await until(lambda: _at_least(in_flight, len(order_ids)))
                    await direct.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
                    with anyio.fail_after(10):
                        await direct.set("probe", 1)  # a write: returns when the pause is over
                    await direct.execute_command("DEBUG", "SLEEP", 3)
                    paused.set()
                    for order_id in order_ids:
                        await approve(client, order_id)
                    await ended(client, *order_ids)
            finally:
                await proxied.aclose()
        effects = [e.decode() for e in await direct.lrange("test:effects", 0, -1)]
        expected = {f"{order_id}:{step}:do" for order_id in order_ids for step in STEPS}
        assert len(effects) == len(set(effects))
        assert set(effects) == expected
        assert len(in_flight) == len(order_ids), "a charge was reclaimed and run again"
        assert {int(await direct.get(f"test:runs:{key}")) for key in expected} == {1}, "a handler ran twice"
        for order_id in order_ids:
            assert (await client.get(order_id)).status == SagaStatus.COMPLETED
    finally:
        await direct.aclose()
        server.kill()


async def _at_least(items: list[str], count: int) -> bool:
    return len(items) >= count


@pytest.fixture
def pg_outbox(pg_dsn: str) -> Iterator[OutboxDb]:
    """A PostgreSQL outbox in tables of this test's own (tests/relay's ``postgres_db``)."""
    tables = relay.Tables.prefixed(f"t{uuid.uuid4().hex[:10]}")
    in_thread(relay.init_db, pg_dsn, tables)
    try:
        yield OutboxDb("postgresql", pg_dsn, tables)
    finally:
        drop_pg_tables(pg_dsn, tables)


async def _break_db_link(proxy: FaultProxy, fault: str, relayed: relay.Relay) -> None:
    if fault == "reset":
        proxy.set_mode(Mode.RESET)
        await until(lambda: _outages(relayed))
    elif fault == "ambiguous commit":  # the server commits, the relay sees a broken link
        proxy.set_mode(Mode.SWALLOW_REPLY, match=b"COMMIT", times=1)
        await until(lambda: _swallowed(proxy))
    else:  # blackhole: statements hang until the link heals and the stale connections close
        proxy.set_mode(Mode.BLACKHOLE)
        await until(lambda: _dropped(proxy))
    proxy.set_mode(Mode.PASS)


async def _outages(relayed: relay.Relay) -> bool:
    return relayed.counters.outages > 0


async def _dropped(proxy: FaultProxy) -> bool:
    return proxy.counters.dropped_bytes > 0


@pytest.mark.postgres
@pytest.mark.parametrize("fault", ["reset", "ambiguous commit", "blackhole"])
async def test_database_link_broken_mid_transaction_loses_no_row_and_publishes_none_twice(
    fault: str, pg_outbox: OutboxDb, real_redis: bus.Redis
) -> None:
    """Catalogue item 18 through the proxy: the relay's PostgreSQL link breaks mid-round.

    A reset or a blackhole rolls the round back (its rows are claimed again); a swallowed
    COMMIT reply leaves the round committed while the relay sees an error. Either way every
    committed row is published once and marked sent.
    """
    rows = 2000
    conn = pg_outbox.connect()
    outbox = relay.Outbox(pg_outbox.tables)
    for n in range(rows):
        outbox.add(conn, "payments", RowCharged(order=f"o{n}", seq=n))
    conn.commit()
    conn.close()
    async with FaultProxy.to_url(pg_outbox.dsn) as proxy:
        relayed = relay.Relay.connect(
            proxy.url(pg_outbox.dsn), real_redis, config=pg_outbox.config(batch_size=20, backoff_cap_s=0.2)
        )
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(relayed.run, drain=True))

            async def some_published() -> bool:
                return await real_redis.xlen(PAYMENTS.key) >= rows // 10

            await until(some_published)
            await _break_db_link(proxy, fault, relayed)
    assert await real_redis.xlen(PAYMENTS.key) < rows or relayed.counters.outages, "the fault came too late"
    published = await entry_ids(real_redis, PAYMENTS)
    assert len(published) == len(set(published)) == rows, "a row was lost or published twice"
    marked = pg_outbox.query("SELECT message_id, status FROM {outbox}")
    assert {message_id for message_id, _ in marked} == set(published)
    assert {status for _, status in marked} == {1}


@pytest.mark.postgres
async def test_a_blackholed_database_link_is_given_up_within_the_timeout(
    pg_outbox: OutboxDb, real_redis: bus.Redis
) -> None:
    """A link that answers nothing (a half-open connection, a partition): the relay gives
    the round up after ``db_timeout_s`` and reconnects, instead of waiting forever, and
    after the heal every row is published once."""
    timeout = {"db_timeout_s": 0.5}
    rows = 2000
    conn = pg_outbox.connect()
    outbox = relay.Outbox(pg_outbox.tables)
    for n in range(rows):
        outbox.add(conn, "payments", RowCharged(order=f"o{n}", seq=n))
    conn.commit()
    conn.close()
    async with FaultProxy.to_url(pg_outbox.dsn) as proxy:
        config = pg_outbox.config(batch_size=20, backoff_cap_s=0.2, **timeout)
        relayed = relay.Relay.connect(proxy.url(pg_outbox.dsn), real_redis, config=config)
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(relayed.run, drain=True))

            async def some_published() -> bool:
                return await real_redis.xlen(PAYMENTS.key) >= rows // 10

            await until(some_published)
            proxy.set_mode(Mode.BLACKHOLE)
            await until(lambda: _outages(relayed))  # while the link is still blackholed
            assert proxy.mode == Mode.BLACKHOLE
            proxy.set_mode(Mode.PASS)
    published = await entry_ids(real_redis, PAYMENTS)
    assert len(published) == len(set(published)) == rows
    assert pg_outbox.query("SELECT DISTINCT status FROM {outbox}") == [(1,)]


async def test_a_schedule_create_re_sent_returns_the_schedule_it_created(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    """schedule_write.lua re-sent after its reply was lost finds the schedule it created:
    the caller gets it, not :class:`ScheduleExists`. Another schedule under that id still
    raises."""
    schedule = Schedule(
        id="hourly", saga="net", context=NET.name, data=msgspec.Raw(b'{"id": "h"}'), cron="0 * * * *"
    )
    async with swallowing(real_redis_url, script(SCHEDULE_WRITE)) as (_, proxied):
        info = await ScheduleClient(proxied, NET.name).create(schedule)
    assert info.schedule == schedule
    assert info.revision == 1
    with pytest.raises(ScheduleExists):
        await ScheduleClient(real_redis, NET.name).create(msgspec.structs.replace(schedule, cron="0 0 * * *"))


async def test_a_migration_commit_re_sent_is_reported_as_migrated(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    """migrate.lua re-sent after its reply was lost answers 'conflict' (the saga moved:
    because of this very call). The saga is migrated once and reported as migrated."""
    clock = FakeClock()
    client = await sagas_in_flight(real_redis, clock)
    async with swallowing(real_redis_url, script(MIGRATE)) as (_, proxied):
        report = await run_migration(proxied, v1_to_v2, clock=clock)
    outcomes = {r.saga_id: r.outcome for r in report.results}
    assert outcomes == {"s1": "migrated", "s2": "migrated", "refuse-1": "refused"}
    for saga_id in ("s1", "s2"):
        raw = await real_redis.lrange(f"rs:{{shop:0}}:hist:{saga_id}", 0, -1)
        history = decode_history(raw, state=await client.get(saga_id))
        assert sum(isinstance(entry.event, Migrated) for entry in history) == 1


async def test_connections_reset_mid_flight_every_saga_ends_with_one_effect_per_step(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    """RSTs on every worker and client connection, three times while sagas run: redis-py
    reconnects and re-sends, the scripts make each repeat harmless (G1, G2, G4, G7)."""
    order_ids = [f"order-{n}" for n in range(20)]
    async with FaultProxy.to_url(real_redis_url, seed=3) as proxy:
        proxied = bus.connect(proxy.url(real_redis_url), CLIENT)
        application = app(real_redis)
        client = SagaClient(proxied, application.registry)
        try:
            async with worker(proxied, application):
                for round_number, order_id in enumerate(order_ids):
                    await client.start("net", Order(id=order_id), saga_id=order_id)
                    if round_number % 7 == 3:
                        resets = proxy.counters.resets
                        proxy.set_mode(Mode.RESET)
                        await until(lambda n=resets: _reset_more(proxy, n))  # type: ignore[misc]
                        proxy.set_mode(Mode.PASS)
                for order_id in order_ids:
                    await approve(client, order_id)
                await ended(client, *order_ids)
        finally:
            await proxied.aclose()
    await check_applied_once(real_redis, *order_ids)


async def _reset_more(proxy: FaultProxy, than: int) -> bool:
    return proxy.counters.resets > than
