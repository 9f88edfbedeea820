"""The lease watchdog: a handler whose heartbeats stopped getting through is abandoned.

The network fault test (tests/faults/test_network.py, catalogue item 10) shows it through a
blackholed link; these pin the rule itself on every backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from anyio.abc import TaskGroup

import bus
from bus import Bus, BusConfig, Delivery, Worker
from bus._pool import HandlerPool
from tests.bus.test_contract import COMMANDS, CONFIG, Charge, Charged, publish_charge, replies
from tests.helpers import age_pending, eventually, pending

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]


def test_the_heartbeat_may_take_at_most_half_the_lease() -> None:
    with pytest.raises(ValueError, match="half of lease_ms"):
        BusConfig(lease_ms=1_000, heartbeat_ms=600)
    config = BusConfig(lease_ms=1_000, heartbeat_ms=500)
    assert config.effective_heartbeat_ms < config.give_up_ms < config.lease_ms


@asynccontextmanager
async def one_handler_running(
    redis: bus.Redis, app: Bus, started: anyio.Event
) -> AsyncIterator[tuple[Worker, TaskGroup, Delivery]]:
    """A worker handling one published charge, its handler running (it set ``started``)."""
    worker = Worker(redis, app, config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    async with anyio.create_task_group() as group:
        group.start_soon(worker.run_until_idle)
        await started.wait()
        [delivery] = [d for d in worker.consumers[0].inflight.values() if d is not None]
        yield worker, group, delivery


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

    async with one_handler_running(redis, app, started) as (worker, _, delivery):
        consumer = worker.consumers[0]
        consumer.abandon_unbeaten(delivery.last_beat_ms)  # beaten at the cutoff: kept
        await anyio.wait_all_tasks_blocked()
        assert outcomes == []
        consumer.abandon_unbeaten(delivery.last_beat_ms + 1)
    assert outcomes == ["abandoned"]
    [entry] = await pending(redis, COMMANDS, "payments")  # nothing completed: still pending
    assert entry["consumer"] == worker.consumer


@pytest.mark.parametrize(
    ("first_ends", "handled", "left_pending"),
    [
        ("abandoned", [1, 2], False),  # the copy runs at once, not a lease later
        ("completed", [1], False),  # acknowledged: the copy finds nothing pending, runs nothing
        ("unchecked", [1], True),  # its pending check failed: it waits for the reclaimer
    ],
)
async def test_an_entry_given_back_while_its_handler_runs_waits_for_that_handler_to_end(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch, first_ends: str, handled: list[int], left_pending: bool
) -> None:
    """Our own reclaimer took the entry of a handler whose heartbeats stopped: a second copy,
    which must not run beside the first. When the first ends, the copy is handled if the
    entry is still pending for this worker, and gives its slot back either way."""
    deliveries: list[int] = []
    started, release = anyio.Event(), anyio.Event()
    app = Bus("payments")

    @app.handler(COMMANDS, Charge)
    async def charge(command: Charge, delivery: Delivery) -> Charged:
        deliveries.append(delivery.deliveries)
        if len(deliveries) == 1:
            started.set()
            await release.wait()
        return Charged(order=command.order, receipt="r-1")

    async with one_handler_running(redis, app, started) as (worker, group, first):
        consumer = worker.consumers[0]
        await age_pending(redis, COMMANDS, "payments", first.entry_id, CONFIG.lease_ms)
        pool = HandlerPool(group, 4)
        assert await consumer.reclaim(pool) == 1
        await anyio.wait_all_tasks_blocked()
        assert deliveries == [1]  # the copy waits for the first handler
        if first_ends == "completed":
            release.set()
        else:
            if first_ends == "unchecked":
                monkeypatch.setattr(consumer.intake, "delivery_counts", unreachable)
            first.scope.cancel()  # what the watchdog does
        await eventually(lambda: worker.runtime.slots.busy == 0, 10, "every slot was given back")
        pool.close()
    assert deliveries == handled
    assert bool(await pending(redis, COMMANDS, "payments")) == left_pending
    assert [reply.correlation_id for reply in await replies(redis)] == ([] if left_pending else ["saga-o1"])


async def unreachable(entry_ids: list[str], *, among: int = 0) -> dict[str, int]:
    """``Intake.delivery_counts`` with Redis gone (an empty ask needs no Redis)."""
    if entry_ids:
        raise bus.RedisUnavailable("connection refused")
    return {}
