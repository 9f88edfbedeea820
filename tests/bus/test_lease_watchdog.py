"""The lease watchdog: a handler whose heartbeats stopped getting through is abandoned.

The network fault test (tests/faults/test_network.py, FAULTS 10) shows it through a
blackholed link; these pin the rule itself on every backend.
"""

from __future__ import annotations

import anyio
import pytest

import bus
from bus import Bus, BusConfig, Delivery, Worker
from bus._pool import HandlerPool
from tests.bus.test_contract import COMMANDS, CONFIG, Charge, Charged, publish_charge, replies
from tests.helpers import age_pending, eventually, pending

pytestmark = pytest.mark.anyio


def test_the_heartbeat_may_take_at_most_half_the_lease() -> None:
    with pytest.raises(ValueError, match="half of lease_ms"):
        BusConfig(lease_ms=1_000, heartbeat_ms=600)
    config = BusConfig(lease_ms=1_000, heartbeat_ms=500)
    assert config.effective_heartbeat_ms < config.give_up_ms < config.lease_ms


async def test_only_a_handler_unbeaten_past_the_cutoff_is_abandoned(redis: bus.Redis) -> None:
    started, outcomes = anyio.Event(), []
    app = Bus("payments")

    @app.handler(COMMANDS, Charge)
    async def slow(command: Charge, delivery: Delivery) -> None:
        started.set()
        try:
            await anyio.Event().wait()
        except anyio.get_cancelled_exc_class():
            outcomes.append("abandoned")
            raise

    worker = Worker(redis, app, config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run_until_idle)
        await started.wait()
        consumer = worker.consumers[0]
        [delivery] = [d for d in consumer.inflight.values() if d is not None]
        consumer.abandon_unbeaten(delivery.last_beat_ms)  # beaten at the cutoff: kept
        await anyio.wait_all_tasks_blocked()
        assert outcomes == []
        consumer.abandon_unbeaten(delivery.last_beat_ms + 1)
    assert outcomes == ["abandoned"]
    [entry] = await pending(redis, COMMANDS, "payments")  # nothing completed: still pending
    assert entry["consumer"] == worker.consumer


async def test_an_entry_given_back_while_its_handler_runs_is_handled_once_that_handler_ends(
    redis: bus.Redis,
) -> None:
    """Our own reclaimer took the entry of a handler whose heartbeats stopped (a second copy,
    which must not run beside the first); the watchdog then abandons the first. The copy is
    handled at once: nobody else holds the entry, and a lease later would be a stalled saga."""
    deliveries: list[int] = []
    started = anyio.Event()
    app = Bus("payments")

    @app.handler(COMMANDS, Charge)
    async def charge(command: Charge, delivery: Delivery) -> Charged:
        deliveries.append(delivery.deliveries)
        if len(deliveries) == 1:
            started.set()
            await anyio.Event().wait()  # until abandoned
        return Charged(order=command.order, receipt="r-1")

    worker = Worker(redis, app, config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run_until_idle)
        await started.wait()
        consumer = worker.consumers[0]
        [first] = [d for d in consumer.inflight.values() if d is not None]
        await age_pending(redis, COMMANDS, "payments", first.entry_id, CONFIG.lease_ms)
        pool = HandlerPool(group, 4)
        assert await consumer.reclaim(pool) == 1
        await anyio.wait_all_tasks_blocked()
        assert deliveries == [1]  # the copy waits for the first handler
        first.scope.cancel()  # what the watchdog does

        async def settled() -> bool:
            return not await pending(redis, COMMANDS, "payments")

        await eventually(settled, 10, "the copy was handled and acknowledged")
        pool.close()
    assert deliveries == [1, 2]
    [reply] = await replies(redis)
    assert reply.correlation_id == "saga-o1"  # one reply: the copy's
