"""Retention: an ended saga's index entry, counter and human tasks go once its hash has expired."""

from __future__ import annotations

import pytest

import bus
from bus import FakeClock
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import app
from saga import App, EngineConfig, SagaAdmin, SagaClient, SagaStatus, SagaWorker
from saga.definition.human_tasks import TaskResult
from saga.runtime.task_client import TaskClient
from saga.runtime.tasks import role_table
from saga.store.keys import Partition
from tests.saga.task_sagas import Approval, Refund, refund

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
PARTITION = Partition("orders", 0)
PART = Partition("refunds", 0)
DAY = 86_400
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000), retention_s=DAY)
COMPLETED = ("order_fulfilment@1", "completed")


def order(n: int) -> Order:
    return Order(id=f"o{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=100)


async def ended(redis: bus.Redis, count: int) -> tuple[SagaWorker, SagaClient, FakeClock]:
    clock = FakeClock()
    worker = SagaWorker(redis, app, config=CONFIG, clock=clock)
    client = SagaClient(redis, app.registry, clock=clock, config=CONFIG)
    for n in range(count):
        await client.start(order_fulfilment, order(n), saga_id=f"s{n}")
    await worker.run_until_idle()
    assert (await client.counts())[COMPLETED] == count
    return worker, client, clock


async def test_expired_sagas_leave_the_index_and_the_counters(redis: bus.Redis) -> None:
    worker, client, clock = await ended(redis, 3)
    assert await worker.prune_ended() == 0  # nothing has expired yet
    for n in range(2):
        await redis.delete(PARTITION.saga(f"s{n}"))  # what Redis does when the TTL runs out
    clock.advance(DAY + 1)
    assert await worker.prune_ended() == 2
    assert await client.list(SagaStatus.COMPLETED) == ["s2"]
    assert (await client.counts())[COMPLETED] == 1
    assert await redis.zrange(PARTITION.ending, 0, -1) == [b"order_fulfilment@1|completed|s2"]
    assert await worker.prune_ended() == 0  # a repeat changes nothing


async def test_a_saga_whose_hash_lives_on_is_kept(redis: bus.Redis) -> None:
    worker, client, clock = await ended(redis, 2)
    await redis.persist(PARTITION.saga("s0"))  # an operator kept it (or it was redriven)
    clock.advance(DAY + 1)  # the worker's clock ran ahead of Redis's: s1's hash still has a TTL
    assert await worker.prune_ended() == 0
    assert sorted(await client.list(SagaStatus.COMPLETED)) == ["s0", "s1"]
    assert (await client.counts())[COMPLETED] == 2
    assert await redis.zrange(PARTITION.ending, 0, -1) == [b"order_fulfilment@1|completed|s1"]  # moved on


async def test_a_new_saga_under_an_expired_id_keeps_only_its_own_entry(redis: bus.Redis) -> None:
    worker, client, clock = await ended(redis, 1)
    await redis.delete(PARTITION.saga("s0"), PARTITION.history("s0"))
    await client.start(order_fulfilment, order(0), saga_id="s0")  # the id is free again: runs anew
    clock.advance(DAY + 1)
    assert await worker.prune_ended() == 1  # the old saga's completed entry goes
    assert await client.list(SagaStatus.COMPLETED) == []
    counts = await client.counts()
    assert counts[COMPLETED] == 0
    assert sum(n for (_, status), n in counts.items() if status != "completed") == 1


async def test_a_forgotten_saga_takes_its_human_tasks_and_their_log_with_it(redis: bus.Redis) -> None:
    clock = FakeClock(1_800_000_000_000)
    refunds = App("refunds", sagas=[refund])
    worker = SagaWorker(redis, refunds, config=CONFIG, clock=clock)
    client = SagaClient(redis, refunds.registry, clock=clock, config=CONFIG)
    tasks = TaskClient(redis, refunds.registry, authorize=role_table({"managers": {"ann"}}), clock=clock)
    for n in range(3):
        await client.start(refund, Refund(id=f"r{n}", amount=500), saga_id=f"r{n}")
    await worker.run_until_idle()
    ids = {t.saga_id: t.id for t in await tasks.list(role="managers")}
    await tasks.complete(ids["r0"], Approval(approved=True), by="ann")  # answered: the task is closed
    admin = SagaAdmin(redis, refunds, clock=clock, by="ops")
    forced = TaskResult[Approval](answer=Approval(approved=True), by="ops")
    await admin.force_complete("r1", "approve.answer", forced, reason="by phone", wait_s=0)
    await worker.run_until_idle()  # r1 ended around its task: it is still open, indexed and timed
    assert [(await client.get(f"r{n}")).status for n in range(3)] == ["completed", "completed", "suspended"]
    assert await redis.zcard(PART.tasks_for("role:managers")) == 2
    for n in range(2):
        await redis.delete(PART.saga(f"r{n}"))  # their retention ran out
    clock.advance(DAY + 1)
    assert await worker.prune_ended() == 2
    for gone in ("r0", "r1"):
        assert not await redis.exists(PART.task(ids[gone]), PART.task_log(gone))
    assert await redis.zrange(PART.tasks_for("role:managers"), 0, -1) == [ids["r2"].encode()]
    timers = await redis.zrange(PART.task_timers, 0, -1)
    assert timers
    assert {m.decode().rpartition("|")[0] for m in timers} == {ids["r2"]}
    assert (await tasks.show(ids["r2"])).state == "open"  # the suspended saga keeps its task
    assert [e.action for e in await tasks.log("r2")] == ["opened"]
