"""Rate limits on Redis: the shared bucket, held commands as durable timers, tokens given back."""

from __future__ import annotations

import pytest

import bus
from bus import FakeClock
from bus.lowlevel import slot_of
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import app as stateless
from saga import (
    App,
    Command,
    CommandContext,
    Context,
    EngineConfig,
    Participant,
    RateLimit,
    Saga,
    SagaAdmin,
    SagaClient,
    SagaStatus,
    SagaWorker,
    command,
)
from saga.core.rate_rules import held
from saga.store.keys import LimitKeys, Partition, partition_of
from saga.store.rates import set_limit
from tests.flow.rate_app import Call, Called, Job
from tests.helpers import age_pending, pending

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))
PARTITION = Partition("orders", 0)


def order(n: int) -> Order:
    return Order(id=f"o{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=100)


def limited(*limits: RateLimit) -> App:
    return App("limited", sagas=[order_fulfilment], participants=stateless.participants, limits=limits)


async def sent(redis: bus.Redis, participant: str) -> int:
    """Commands sent to ``participant`` so far (its stream keeps them)."""
    return int(await redis.xlen(PARTITION.commands(participant).key))


async def held_steps(client: SagaClient, ids: list[str]) -> list[str]:
    waiting = []
    for saga_id in ids:
        state = await client.get(saga_id)
        waiting += [f"{saga_id}/{key}" for key, record in state.steps.items() if held(saga_id, key, record)]
    return waiting


async def test_commands_over_the_limit_wait_as_timers_and_go_when_their_tokens_are_due(
    redis: bus.Redis,
) -> None:
    clock = FakeClock()
    worker = SagaWorker(redis, limited(RateLimit("inventory", "1/s", burst=2)), config=CONFIG, clock=clock)
    client = SagaClient(redis, worker.app.registry, clock=clock)
    ids = [await client.start(order_fulfilment, order(n), saga_id=f"s{n}") for n in range(5)]
    await worker.run_until_idle()
    assert await sent(redis, "inventory") == 2  # the burst
    assert await held_steps(client, ids) == [f"s{n}/reserve_stock" for n in range(2, 5)]
    view = await SagaAdmin(redis, worker.app, clock=clock).inspect("s4")
    assert view.waiting_for == "a rate limit's token for its command to inventory (due in 3.0s)"
    assert [(await client.get(i)).status for i in ids[:2]] == [SagaStatus.COMPLETED] * 2
    for second in range(1, 4):
        clock.advance(1.0)
        await worker.run_until_idle()
        assert await sent(redis, "inventory") == 2 + second  # one token a second, no more
    assert await held_steps(client, ids) == []
    assert {(await client.get(i)).status for i in ids} == {SagaStatus.COMPLETED}


async def test_a_running_worker_follows_a_limit_changed_by_an_operator(redis: bus.Redis) -> None:
    """The worker keeps no copy of a limit: each take reads the operator's rate from the bucket.

    ``saga limits set`` writes it there with the Redis clock; here its function is given the
    worker's virtual clock, so every second below is a virtual one.
    """
    clock = FakeClock()
    limit = RateLimit("inventory", "2/s", burst=1)
    worker = SagaWorker(redis, limited(limit), config=CONFIG, clock=clock)
    client = SagaClient(redis, worker.app.registry, clock=clock)

    async def sent_per_second(first: int, sagas: int, seconds: int) -> list[int]:
        for n in range(first, first + sagas):
            await client.start(order_fulfilment, order(n), saga_id=f"s{n}")
        await worker.run_until_idle()
        counts, before = [], await sent(redis, "inventory")
        for _ in range(seconds):
            clock.advance(1.0)
            await worker.run_until_idle()
            counts.append(await sent(redis, "inventory") - before)
            before += counts[-1]
        return counts

    assert await sent_per_second(0, 8, seconds=3) == [2, 2, 2]
    clock.advance(10.0)  # the first batch done, the bucket full again
    await worker.run_until_idle()
    await set_limit(
        redis,
        "inventory",
        rate=10.0,
        burst=None,
        declared=limit,
        by="ops",
        change_id="c1",
        now_ms=clock.now_ms(),
    )
    assert await sent_per_second(100, 40, seconds=3) == [10, 10, 10]


async def test_a_step_limit_holds_only_that_steps_commands(redis: bus.Redis) -> None:
    clock = FakeClock()
    worker = SagaWorker(
        redis, limited(RateLimit("order_fulfilment.charge_payment", "1/s")), config=CONFIG, clock=clock
    )
    client = SagaClient(redis, worker.app.registry, clock=clock)
    ids = [await client.start(order_fulfilment, order(n), saga_id=f"s{n}") for n in range(3)]
    await worker.run_until_idle()
    assert await sent(redis, "inventory") == 3
    assert await sent(redis, "payments") == 1
    assert await held_steps(client, ids) == ["s1/charge_payment", "s2/charge_payment"]


async def test_a_saga_cancelled_while_its_command_waits_sends_nothing_and_gives_its_token_back(
    redis: bus.Redis,
) -> None:
    clock = FakeClock()
    limit = RateLimit("inventory", "1/s", burst=1)
    worker = SagaWorker(redis, limited(limit), config=CONFIG, clock=clock)
    client = SagaClient(redis, worker.app.registry, clock=clock)
    ids = [await client.start(order_fulfilment, order(n), saga_id=f"s{n}") for n in range(3)]
    await worker.run_until_idle()
    keys = LimitKeys("inventory")
    assert await redis.zcard(keys.grants) == 3  # one token now, two promised
    assert float(await redis.hget(keys.bucket, "tokens")) == -2

    await client.cancel("s2", reason="changed my mind")
    await worker.run_until_idle()
    s2 = await client.get("s2")
    assert s2.status == SagaStatus.CANCELLED  # nothing completed: nothing to undo
    attempt = s2.steps["reserve_stock"].attempts[0]
    assert attempt.outcome == "cancelled"
    assert float(await redis.hget(keys.bucket, "tokens")) == -1  # its token went back
    assert await redis.zscore(keys.grants, attempt.command_id) is None

    clock.advance(5.0)  # every timer due, the cancelled one's among them
    await worker.run_until_idle()
    assert await sent(redis, "inventory") == 2  # s0 and s1: s2's command never went
    assert [(await client.get(i)).status for i in ids[:2]] == [SagaStatus.COMPLETED] * 2


SPREAD = Context("spread", partitions=4)
spread = Saga("spread", version=1, context=SPREAD, data=Job)
spread_api = Participant("api", serves=[SPREAD])


@spread.step(reply=Called)
def call_api(_job: Job) -> Command:
    return command("api", Call())


@spread_api.handles(Call)
async def answer(_message: Call, _ctx: CommandContext) -> Called:
    return Called()


async def test_one_bucket_limits_sagas_of_every_partition_each_in_its_own_slot(redis: bus.Redis) -> None:
    """The limit's keys share a hash tag of their own: on a cluster, a slot apart from every
    partition's, so the take is its own single-slot script beside each transition."""
    clock = FakeClock()
    app = App("spread", sagas=[spread], participants=[spread_api], limits=[RateLimit("api", "2/s", burst=2)])
    worker = SagaWorker(redis, app, config=CONFIG, clock=clock)
    client = SagaClient(redis, app.registry, clock=clock)
    ids = [await client.start(spread, Job(id=f"j{n}"), saga_id=f"j{n}") for n in range(12)]
    partitions = {Partition("spread", partition_of(i, 4)) for i in ids}
    assert len(partitions) == 4
    limit_slot = slot_of(LimitKeys("api").bucket)
    assert limit_slot not in {slot_of(p.inbox.key) for p in partitions}
    for seconds in range(6):
        await worker.run_until_idle()
        sent = sum([int(await redis.xlen(p.commands("api").key)) for p in partitions])
        assert sent == 2 + 2 * seconds  # every partition draws on the same bucket
        clock.advance(1.0)
    assert {(await client.get(i)).status for i in ids} == {SagaStatus.COMPLETED}


async def test_a_take_that_fails_leaves_the_round_for_redelivery_and_commits_nothing(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    worker = SagaWorker(
        redis, limited(RateLimit("order_fulfilment.charge_payment", "1/s")), config=CONFIG, clock=clock
    )
    client = SagaClient(redis, worker.app.registry, clock=clock)
    await client.start(order_fulfilment, order(1), saga_id="s1")

    async def unreachable(*_: object) -> list[object]:
        raise bus.RedisUnavailable("connection refused")

    monkeypatch.setattr("saga.runtime.rate_gate.run_calls", unreachable)
    await worker.run_until_idle()
    assert (await client.get("s1")).revision == 1  # the stock reply is not committed
    assert await sent(redis, "payments") == 0
    [entry] = await pending(redis, PARTITION.inbox, "orchestrator")  # left for redelivery
    monkeypatch.undo()
    await age_pending(redis, PARTITION.inbox, "orchestrator", str(entry["id"]), CONFIG.bus.lease_ms * 10)
    await worker.run_until_idle()
    assert (await client.get("s1")).status == SagaStatus.COMPLETED
