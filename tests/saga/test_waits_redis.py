"""Sleeps, signals, event waits, queries and deadlines on Redis (fakeredis and real Redis).

The worker runs with a FakeClock: scripts judge timers by it, so the tests move time
instead of sleeping. Every saga's Redis history must replay through the decider.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

import bus
from bus import FakeClock, Publisher
from saga import (
    App,
    EngineConfig,
    InvalidInput,
    InvalidToken,
    Registry,
    Saga,
    SagaClient,
    SagaStatus,
    SagaWorker,
    WaitEnded,
)
from saga.core.model import SignalReceived, TimerFired
from saga.core.tokens import Signer
from saga.runtime.protocol import SIGNAL, SignalDelivery
from saga.store.keys import Partition
from saga.testing import decode_history, invariant_violations, replay
from tests.helpers import dead_letters, envelope_items, keys_matching
from tests.saga.time_sagas import (
    LENDING,
    NOON,
    TREASURY_EVENTS,
    Approval,
    FundsReady,
    Loan,
    Trip,
    loan,
    participants,
    trip,
)

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
PARTITION = Partition(LENDING, 0)
SECRET = "a test secret of at least sixteen bytes"
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000), signal_secret=SECRET)
YES = Approval(approved=True, by="ann")
MAC = b" \xff\x00" + bytes(range(1, 14))
"""A raw MAC with a space and bytes that are not UTF-8 in it."""


class World:
    def __init__(self, redis: bus.Redis) -> None:
        self.redis = redis
        self.clock = FakeClock(int(NOON.timestamp() * 1000))
        self.effects: list[tuple[str, str]] = []
        self.tokens: list[str] = []
        self.app = App("lending", sagas=[loan, trip], participants=participants(self.effects, self.tokens))
        self.worker = SagaWorker(redis, self.app, config=CONFIG, clock=self.clock, consumer="w1")
        self.client = SagaClient(redis, self.app.registry, clock=self.clock, config=CONFIG)

    async def idle(self) -> None:
        with anyio.fail_after(30):
            await self.worker.run_until_idle()

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.idle()

    async def publish(self, message: object) -> None:
        await Publisher(self.redis, source="treasury").publish(TREASURY_EVENTS, message)

    async def check(self, saga_id: str) -> None:
        state = await self.client.get(saga_id)
        definition = self.app.registry.get(state.name, state.version)
        raw = await self.redis.lrange(PARTITION.history(saga_id), 0, -1)
        signer = Signer.from_secret(SECRET, LENDING)
        assert replay(definition, raw, saga_id=saga_id, signer=signer, state=state) == state
        assert invariant_violations(definition, state, decode_history(raw, state=state)) == []


async def waiting(redis: bus.Redis, loan_data: Loan | None = None) -> tuple[World, str]:
    world = World(redis)
    await world.worker.bus_worker.setup()  # the event subscription exists before events come
    saga_id = await world.client.start(loan, loan_data or Loan(id="L1", amount=500), saga_id="L1")
    await world.idle()
    return world, saga_id


async def test_a_loan_waits_for_a_signal_sleeps_and_waits_for_an_event(redis: bus.Redis) -> None:
    world, saga_id = await waiting(redis)
    query = await world.client.query(saga_id)
    assert query.status == SagaStatus.SUSPENDED
    assert query.wait is not None
    assert (query.wait.kind, query.wait.step) == ("signal", "approval")
    assert query.wait.token == world.tokens[0]
    assert query.wait.until_ms == world.clock.now_ms() + 2 * 86_400_000

    await world.client.signal(world.tokens[0], YES)
    await world.idle()
    sleeping = await world.client.query(saga_id)
    assert sleeping.wait is not None
    assert sleeping.wait.kind == "sleep"
    assert sleeping.wait.until_ms == world.clock.now_ms() + 3_600_000

    await world.advance(3_599)
    assert (await world.client.get(saga_id)).wait.step == "cool_off"  # type: ignore[union-attr]
    await world.advance(1)
    event_wait = (await world.client.query(saga_id)).wait
    assert event_wait is not None
    assert (event_wait.kind, event_wait.key) == ("event", "L1")

    await world.publish(FundsReady(loan_id="L2", ref="not ours"))
    await world.idle()
    assert (await world.client.get(saga_id)).status == SagaStatus.SUSPENDED
    await world.publish(FundsReady(loan_id="L1", ref="wire-9"))
    await world.idle()
    assert (await world.client.get(saga_id)).status == SagaStatus.COMPLETED
    assert world.effects == [("L1", "reserve"), ("L1", "disburse")]
    await world.check(saga_id)
    # the wait's registration is gone once it ended
    assert await keys_matching(redis, f"rs:{{{LENDING}:w:*}}:wait:*") == []


async def test_an_event_before_its_wait_is_buffered_and_matched(redis: bus.Redis) -> None:
    world, saga_id = await waiting(redis)
    await world.publish(FundsReady(loan_id="L1", ref="early"))
    await world.idle()
    await world.client.signal(world.tokens[0], YES)
    await world.idle()
    await world.advance(3_600)
    assert (await world.client.get(saga_id)).status == SagaStatus.COMPLETED
    await world.check(saga_id)


async def test_a_signal_delivered_twice_concurrently_resumes_once(redis: bus.Redis) -> None:
    world, saga_id = await waiting(redis)
    second = SagaWorker(redis, world.app, config=CONFIG, clock=world.clock, consumer="w2")
    other_client = SagaClient(redis, world.app.registry, clock=world.clock, config=CONFIG)
    token = world.tokens[0]
    async with anyio.create_task_group() as tg:
        tg.start_soon(world.client.signal, token, YES)
        tg.start_soon(other_client.signal, token, Approval(approved=False, by="bob"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(world.worker.run_until_idle)
        tg.start_soon(second.run_until_idle)
    raw = await redis.lrange(PARTITION.history(saga_id), 0, -1)
    state = await world.client.get(saga_id)
    signals = [h for h in decode_history(raw, state=state) if isinstance(h.event, SignalReceived)]
    assert len(signals) == 2
    assert sorted(bool(h.ignored) for h in signals) == [False, True]
    state = await world.client.get(saga_id)
    assert state.steps["approval"].status == "succeeded"
    assert len(state.steps["approval"].attempts) == 1
    await world.check(saga_id)


async def test_a_forged_token_is_refused_and_nothing_is_written(redis: bus.Redis) -> None:
    world, saga_id = await waiting(redis)
    token = world.tokens[0]
    keys_before = sorted(await keys_matching(redis, "*"))
    inbox_before = await redis.xlen(PARTITION.inbox.key)
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    created = (await world.client.get(saga_id)).created_ms
    other_secret = Signer.from_secret("somebody else's secret!!", LENDING).token(
        0, saga_id, "approval", 1, incarnation=created, now_ms=0
    )
    for bad in (forged, other_secret, "rs2.e30.AAAA", "rs1.e30.AAAA", "x"):
        with pytest.raises(InvalidToken):
            await world.client.signal(bad, YES)
    assert await redis.xlen(PARTITION.inbox.key) == inbox_before
    assert sorted(await keys_matching(redis, "*")) == keys_before
    assert (await world.client.get(saga_id)).status == SagaStatus.SUSPENDED


async def test_a_query_disturbs_nothing(redis: bus.Redis) -> None:
    world, saga_id = await waiting(redis)
    before = await world.client.get(saga_id)
    inbox = await redis.xlen(PARTITION.inbox.key)
    for _ in range(3):
        await world.client.query(saga_id)
    assert await world.client.get(saga_id) == before
    assert await redis.xlen(PARTITION.inbox.key) == inbox


async def test_signal_data_is_checked_by_the_client_and_again_by_the_orchestrator(redis: bus.Redis) -> None:
    world, saga_id = await waiting(redis)
    with pytest.raises(InvalidInput, match="not a valid Approval"):
        await world.client.signal(world.tokens[0], {"approved": "perhaps"})
    # a client without the definition or a registered shape cannot check: the orchestrator
    # dead-letters the signal
    blind = SagaClient(redis, Registry([]), clock=world.clock, config=CONFIG)
    await blind.signal(world.tokens[0], {"approved": "perhaps"})
    await world.idle()
    [letter] = await dead_letters(redis, PARTITION.inbox)
    assert "signal data is not a valid Approval" in letter["reason"]
    assert (await world.client.get(saga_id)).status == SagaStatus.SUSPENDED


async def test_a_client_without_the_code_checks_signal_data_against_the_registered_shape(
    redis: bus.Redis,
) -> None:
    world, saga_id = await waiting(redis)
    await world.worker.register()  # what a running worker has done: its shapes are in Redis
    codeless = SagaClient(redis, Registry([]), clock=world.clock, config=CONFIG)
    inbox = await redis.xlen(PARTITION.inbox.key)
    with pytest.raises(InvalidInput, match="not a valid Approval"):
        await codeless.signal(world.tokens[0], {"approved": "perhaps"})
    assert await redis.xlen(PARTITION.inbox.key) == inbox  # nothing sent
    await codeless.signal(world.tokens[0], {"approved": True, "by": "ann"})
    await world.idle()
    assert (await world.client.get(saga_id)).wait.step == "cool_off"  # type: ignore[union-attr]
    with pytest.raises(WaitEnded, match=r"has ended \(resumed\)"):  # a repeat says so
        await codeless.signal(world.tokens[0], {"approved": True, "by": "ann"})


async def test_the_secret_is_generated_once_per_context_and_shared(redis: bus.Redis) -> None:
    one = SagaClient(redis, Registry([loan]))
    two = SagaClient(redis, Registry([loan]))
    a = (await one.signer(LENDING)).token(0, "s", "approval", 1, incarnation=7, now_ms=0)
    b = (await two.signer(LENDING)).token(0, "s", "approval", 1, incarnation=7, now_ms=0)
    assert a == b
    assert (await one.signer(LENDING)).verify(b).saga_id == "s"
    other = (await one.signer("elsewhere")).token(0, "s", "approval", 1, incarnation=7, now_ms=0)
    with pytest.raises(InvalidToken):
        (await one.signer(LENDING)).verify(other)


async def test_the_deadline_compensates_on_redis(redis: bus.Redis) -> None:
    world = World(redis)
    saga_id = await world.client.start(trip, Trip(id="T1"), saga_id="T1")
    await world.idle()
    query = await world.client.query(saga_id)
    assert query.deadline_ms == world.clock.now_ms() + 7 * 86_400_000
    await world.advance(7 * 86_400)
    state = await world.client.get(saga_id)
    assert state.status == SagaStatus.COMPENSATED
    assert state.expired is not None
    assert world.effects == [("T1", "reserve"), ("T1", "release")]
    assert await redis.zcard(PARTITION.timers) == 0
    await world.check(saga_id)


async def test_a_signal_after_a_timeout_is_refused_by_the_client_and_ignored_by_the_saga(
    redis: bus.Redis,
) -> None:
    world, saga_id = await waiting(redis)
    await world.advance(2 * 86_400)
    assert (await world.client.get(saga_id)).status == SagaStatus.COMPENSATED
    with pytest.raises(WaitEnded, match="wait 1 of step 'approval' in saga 'L1' has ended"):
        await world.client.signal(world.tokens[0], YES)
    # one that raced the timeout (checked by the client before the wait ended) is recorded
    late = SignalDelivery(
        step="approval", n=1, data=msgspec.Raw(b'{"approved":true,"by":"ann"}'), token=world.tokens[0]
    )
    envelope = bus.Envelope(
        id=bus.uuid7(), type=SIGNAL, payload=msgspec.json.encode(late), correlation_id=saga_id
    )
    await Publisher(redis).publish_envelope(PARTITION.inbox, envelope)
    await world.idle()
    raw = await redis.lrange(PARTITION.history(saga_id), 0, -1)
    last = decode_history(raw, state=await world.client.get(saga_id))[-1]
    assert last.ignored.startswith("signal after the saga ended")
    assert last.status == "compensated"


class Order(msgspec.Struct, frozen=True):
    id: str


funds_only: Saga[Order] = Saga("funds_only", context=LENDING, data=Order)
funds_only.wait_event(
    "funds",
    stream=TREASURY_EVENTS,
    message=FundsReady,
    key=lambda event: event.loan_id,
    match=lambda data: data.id,
)


async def test_events_before_and_after_their_waits_on_two_workers_always_meet(redis: bus.Redis) -> None:
    # Half the events come before their saga exists (they must be buffered and found by the
    # registration); the other half come with their sagas' registrations, handled by two
    # workers at once in whatever order their reads interleave.
    app = App("race", sagas=[funds_only])
    clock = FakeClock()
    workers = [SagaWorker(redis, app, config=CONFIG, clock=clock, consumer=f"w{n}") for n in range(2)]
    client = SagaClient(redis, app.registry, clock=clock, config=CONFIG)
    publisher = Publisher(redis, source="treasury")
    ids = [f"o{n}" for n in range(40)]
    early, late = ids[1::2], ids[::2]

    async def both_workers() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for worker in workers:
                    tg.start_soon(worker.run_until_idle)

    await both_workers()  # the subscription exists
    for saga_id in early:
        await publisher.publish(TREASURY_EVENTS, FundsReady(loan_id=saga_id, ref="r"))
    await both_workers()
    assert len(await keys_matching(redis, f"rs:{{{LENDING}:w:*}}:early:*")) == len(early)
    for saga_id in ids:
        await client.start(funds_only, Order(id=saga_id), saga_id=saga_id)
        if saga_id in late:
            await publisher.publish(TREASURY_EVENTS, FundsReady(loan_id=saga_id, ref="r"))
    await both_workers()
    statuses = [(await client.get(i)).status for i in ids]
    assert statuses == [SagaStatus.COMPLETED] * len(ids)


async def test_the_index_scripts_meet_in_either_order(redis: bus.Redis) -> None:
    from bus import Stream
    from saga.store import wait_index as waits
    from saga.store.commit import WatchRequest

    stream = Stream.named(TREASURY_EVENTS)
    request = WatchRequest(
        saga_id="s1", partition=0, step="funds", n=1, stream=stream.key, message_type="FundsReady", key="k"
    )
    event = waits.BufferedEvent(id="e1", type="FundsReady", payload=msgspec.Raw(b"{}"))
    other = waits.BufferedEvent(id="e0", type="Other", payload=msgspec.Raw(b"{}"))
    # event first: buffered (twice delivered, kept once), then found by the registration
    for _ in range(2):
        assert await waits.route(redis, LENDING, stream, other, "k", ttl_ms=60_000, cap=4) == []
        assert await waits.route(redis, LENDING, stream, event, "k", ttl_ms=60_000, cap=4) == []
    assert await redis.llen(f"rs:{{{LENDING}:w:{TREASURY_EVENTS}/stream}}:early:k") == 2
    assert await waits.watch(redis, LENDING, request) == event
    # registration first: the event finds it (and is not buffered)
    later = waits.BufferedEvent(id="e2", type="FundsReady", payload=msgspec.Raw(b"{}"))
    assert await waits.route(redis, LENDING, stream, later, "k", ttl_ms=60_000, cap=4) == [
        waits.Waiter(saga_id="s1", partition=0, step="funds", n=1)
    ]
    await waits.unwatch(redis, LENDING, request)
    assert await waits.route(redis, LENDING, stream, later, "k2", ttl_ms=60_000, cap=4) == []


async def test_timers_stored_in_the_first_layout_still_fire(redis: bus.Redis) -> None:
    # before one-field timers: the event with the timer id inside, the saga id in '<id>:c'
    from saga.runtime.timer_firing import fire_due

    partition = Partition("old", 0)
    timer_id = "s1:step:do:1:retry"
    event = b'{"timer_id":"s1:step:do:1:retry","purpose":"retry","step":"step","kind":"do","attempt":1}'
    await redis.zadd(partition.timers, {timer_id: 1})
    await redis.hset(partition.timer_data, mapping={timer_id: event, f"{timer_id}:c": "s1"})
    assert await fire_due(redis, partition, FakeClock(), 10) == 1
    [(_, fields)] = await redis.xrange(partition.inbox.key)
    assert envelope_items(fields)["corr"] == "s1"
    assert fields[b"data"] == event
    assert await redis.hlen(partition.timer_data) == 0
    from saga.runtime.protocol import to_event

    fired = to_event(bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32))
    assert isinstance(fired, TimerFired)
    assert fired.timer_id == timer_id


def test_a_timer_is_stored_as_an_array_and_signed_without_its_principal() -> None:
    """The signer of a timer is always the context's orchestrator: fire_timers.lua is given it."""
    from saga.store.commit import TimerTemplate

    template = TimerTemplate(purpose="retry", step="step", kind="do", attempt=1, created_ms=7, due_ms=9)
    stored = template.stored("s1", b"k1 " + MAC)
    assert stored == b"2:s1" + b"19:k1 " + MAC + b'["retry","step","do",1,7,9]'
    assert TimerTemplate.parse(stored) == ("s1", template)
    unstamped = TimerTemplate(purpose="retry", step="step", kind="do", attempt=1)  # set before the stamps
    assert TimerTemplate.parse(b'2:s1["retry","step","do",1]') == ("s1", unstamped)
    before = b'2:s1{"purpose":"retry","step":"step","kind":"do","attempt":1}'  # the object layout
    assert TimerTemplate.parse(before) == ("s1", unstamped)


@pytest.mark.parametrize(
    ("timer_id", "saga_id"),
    [("t1", "s1"), ("t" * 40, "s" * 200), ("t" * 300, "s" * 31)],  # each length of MessagePack string
)
async def test_a_signed_timer_fires_with_the_orchestrator_as_its_signer(
    redis: bus.Redis, timer_id: str, saga_id: str
) -> None:
    from saga.runtime.timer_firing import fire_due
    from saga.store.commit import TimerTemplate

    partition = Partition("signed", 0)
    stored = TimerTemplate(purpose="retry", step="step", kind="do", attempt=1).stored(saga_id, b"k1 " + MAC)
    await redis.zadd(partition.timers, {timer_id: 1})
    await redis.hset(partition.timer_data, timer_id, stored)
    assert await fire_due(redis, partition, FakeClock(1_700_000_000_123), 10) == 1
    [(_, fields)] = await redis.xrange(partition.inbox.key)
    entry = bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32)
    assert entry == bus.Envelope(
        id=timer_id,
        type="TimerFired",
        payload=b'["retry","step","do",1,0,0]',
        correlation_id=saga_id,
        created_at_ms=1_700_000_000_123,
        signer="orchestrator:signed",
        key_id="k1",
        mac=MAC,
    )


async def test_more_due_timers_than_a_batch_all_fire_in_one_round(redis: bus.Redis) -> None:
    """A partition whose batch came back full is asked again, alone, until it is drained."""
    from saga.runtime.timer_firing import fire_round
    from saga.store.commit import TimerTemplate

    busy, quiet = Partition("many", 0), Partition("many", 1)
    for n in range(7):
        timer_id = f"s{n}:step:do:1:retry"
        stored = TimerTemplate(purpose="retry", step="step", kind="do", attempt=1).stored(f"s{n}")
        await redis.zadd(busy.timers, {timer_id: 1})
        await redis.hset(busy.timer_data, timer_id, stored)
    await redis.zadd(quiet.timers, {"later:step:do:1:retry": 2**50})  # not due: tells when to wake
    result = await fire_round(redis, [busy, quiet], FakeClock(), batch=3)
    assert result.fired == 7
    assert result.wait_ms is not None
    assert result.wait_ms > 0
    assert await redis.xlen(busy.inbox.key) == 7
    assert await redis.zcard(busy.timers) == 0
    assert await redis.xlen(quiet.inbox.key) == 0
