"""Start requests decided by a running orchestrator: the client reports its verdict, and a saga
whose writes a lost AOF tail took away is started again while its worker runs.

docs/operations.md's runbook for Redis losing the last second of writes: start the lost sagas
again from their business keys, with the same ``saga_id``. The orchestrator keeps running
across the loss (it remembers the saga as it last wrote it), so the new start must be decided
on what Redis holds, not on that memory; and a start whose request is still inside the
publish-dedupe window (its publish record survived, its entry did not) must be sent again.

Signing is on and the client holds no orchestrator keyring, so every start is a request the
orchestrator decides; the orchestrator runs (``SagaWorker.run``) on a real Redis and on the
test cluster, and nothing consumes inventory's commands, so each saga waits in its first step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import msgspec
import pytest

import bus
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from saga import SagaNotFound, SagaStatus, StartConflict, StartPending, Versions
from saga.errors import VersionDrained
from saga.store.keys import Partition
from tests.helpers import dead_letters, eventually
from tests.security.signed_world import SignedWorld

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
PARTITION = Partition("orders", 0)


def order(order_id: str) -> Order:
    return Order(id=order_id, customer="c", lines=[Line(sku="s", quantity=1)], total_cents=900)


@pytest.fixture
async def world(redis: bus.Redis, backend: str) -> AsyncIterator[SignedWorld]:
    """The signed order system with its orchestrator running (no participant runs)."""
    if backend == "fake":
        pytest.skip("a running worker and a lost AOF tail need a real redis-server")
    world = SignedWorld(redis)
    async with anyio.create_task_group() as tg:
        tg.start_soon(world.orchestrator.run)
        with anyio.fail_after(30):
            await world.orchestrator.started.wait()
        yield world
        world.orchestrator.stop()


async def exists(world: SignedWorld, saga_id: str) -> bool:
    try:
        await world.client.get(saga_id)
    except SagaNotFound:
        return False
    return True


async def lose(redis: bus.Redis, saga_id: str, *, keep_publish_record: bool = False) -> None:
    """Remove what a cut AOF tail removes of a saga started by request: every write since."""
    inbox = PARTITION.inbox
    [(request_id, _)] = [
        (entry_id, fields)
        for entry_id, fields in await redis.xrange(inbox.key)
        if saga_id.encode() in fields[b"e"]
    ]
    await redis.xdel(inbox.key, request_id)
    if not keep_publish_record:
        await redis.delete(inbox.published_key)
    command = PARTITION.commands("inventory").key
    await redis.xdel(command, *[i for i, f in await redis.xrange(command) if saga_id.encode() in f[b"e"]])
    await redis.delete(PARTITION.saga(saga_id), PARTITION.history(saga_id), PARTITION.branches(saga_id))
    await redis.zrem(PARTITION.by_status(SagaStatus.RUNNING.value), saga_id)
    await redis.hincrby(PARTITION.counts, "order_fulfilment@1|running", -1)


async def test_a_lost_saga_started_again_while_its_worker_runs_is_created(world: SignedWorld) -> None:
    """docs/operations.md's recovery runbook for a lost AOF tail, end to end."""
    await world.client.start(order_fulfilment, order("H1"), saga_id="H1")
    await eventually(lambda: exists(world, "H1"), 10, "the orchestrator started H1")
    await lose(world.redis, "H1")
    assert not await exists(world, "H1")
    # the runbook: start it again from its business key, with the same saga id
    assert await world.client.start(order_fulfilment, order("H1"), saga_id="H1") == "H1"
    await eventually(lambda: exists(world, "H1"), 10, "the orchestrator started H1 again")
    state = await world.client.get("H1")
    assert state.status == SagaStatus.RUNNING
    assert state.steps["reserve_stock"].attempts, "its first step was dispatched again"


async def test_a_lost_saga_started_again_within_the_publish_dedupe_window_is_created(
    world: SignedWorld,
) -> None:
    await world.client.start(order_fulfilment, order("H2"), saga_id="H2")
    await eventually(lambda: exists(world, "H2"), 10, "the orchestrator started H2")
    await lose(world.redis, "H2", keep_publish_record=True)
    assert await world.client.start(order_fulfilment, order("H2"), saga_id="H2") == "H2"
    await eventually(lambda: exists(world, "H2"), 10, "the orchestrator started H2 again")


async def test_a_start_returns_once_the_orchestrator_created_the_saga(world: SignedWorld) -> None:
    assert await world.client.start(order_fulfilment, order("V1"), saga_id="V1") == "V1"
    assert (await world.client.get("V1")).status == SagaStatus.RUNNING  # no wait needed after it


async def test_a_start_with_other_data_raises_the_conflict_and_sends_nothing(world: SignedWorld) -> None:
    await world.client.start(order_fulfilment, order("V2"), saga_id="V2")
    entries = await world.redis.xlen(PARTITION.inbox.key)
    other = msgspec.structs.replace(order("V2"), total_cents=1)
    with pytest.raises(StartConflict) as conflict:
        await world.client.start(order_fulfilment, other, saga_id="V2")
    assert (conflict.value.saga_id, conflict.value.definition) == ("V2", "order_fulfilment@1")
    assert await world.redis.xlen(PARTITION.inbox.key) == entries
    assert await world.client.start(order_fulfilment, order("V2"), saga_id="V2") == "V2"  # a repeat


async def test_a_start_the_orchestrator_refuses_raises_its_reason(world: SignedWorld) -> None:
    await Versions(world.redis).drain("order_fulfilment", 1, context="orders", by="ops")
    with pytest.raises(VersionDrained, match="order_fulfilment@1 is drained"):
        await world.client.start(order_fulfilment, order("V3"), saga_id="V3")
    [letter] = await dead_letters(world.redis, PARTITION.inbox)
    assert letter["reason"].endswith(
        "start request refused: order_fulfilment@1 is drained (new sagas may not start on it)"
    )
    assert not await exists(world, "V3")


async def test_a_start_no_orchestrator_decides_raises_pending_and_starts_when_one_does(
    redis: bus.Redis, backend: str
) -> None:
    if backend == "fake":
        pytest.skip("one backend is enough: nothing here depends on it")
    world = SignedWorld(redis)  # its orchestrator does not run
    with pytest.raises(StartPending, match=r"not decided within 0\.2 s: is a worker running") as pending:
        await world.client.start(order_fulfilment, order("V4"), saga_id="V4", wait_s=0.2)
    assert pending.value.retryable
    assert await world.client.start(order_fulfilment, order("V4"), saga_id="V4", wait_s=0) == "V4"
    await world.orchestrator.run_until_idle()
    assert (await world.client.get("V4")).status == SagaStatus.RUNNING
    assert await world.client.start(order_fulfilment, order("V4"), saga_id="V4") == "V4"


async def test_a_start_refused_earlier_is_judged_anew_once_the_refusal_no_longer_holds(
    world: SignedWorld,
) -> None:
    versions = Versions(world.redis)
    await versions.drain("order_fulfilment", 1, context="orders", by="ops")
    with pytest.raises(VersionDrained):
        await world.client.start(order_fulfilment, order("V5"), saga_id="V5")
    await versions.undrain("order_fulfilment", 1, context="orders")
    await world.redis.delete(PARTITION.inbox.published_key)  # the publish-dedupe window has passed
    assert await world.client.start(order_fulfilment, order("V5"), saga_id="V5") == "V5"
