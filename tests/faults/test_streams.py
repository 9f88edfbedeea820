"""Stream-level operator faults (catalogue items 14, 15, 16) on real Redis.

An operator trims or deletes entries that are still pending, deletes a consumer, destroys a
consumer group, deletes a whole stream under blocked readers. Each is detected and reported
(a log line and a counter in ``Worker.incidents``; a ``raw_missing`` dead letter for a lost
entry), groups are recreated from ``0``, and every affected saga still ends: a lost command
or reply ends in the step's timeout, which its retry policy re-dispatches (G1), and the
participant's dedupe keeps the effect single (G2).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest
import structlog

import bus
from bus import BusConfig, Worker
from bus._maintenance import trim_stream
from redsaga.examples.orders import RETRY, order_fulfilment
from saga import EngineConfig, SagaStatus
from tests.bus.test_contract import payments_app, publish_charge
from tests.bus.test_faults import eventually
from tests.faults.stream_kit import (
    CONFIG,
    INBOX,
    INVENTORY,
    ORCHESTRATOR,
    PARTITION,
    STEP_TIMEOUT_S,
    Rig,
    letters,
    order,
    read_as,
)
from tests.helpers import age_pending, holds_within, until_redis_clock_passes_newest

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]


async def finish_after_timeout(rig: Rig, saga_id: str) -> None:
    """Let the step time out and be retried; the saga must then complete (G1)."""
    await rig.time_out_and_retry()
    assert (await rig.state(saga_id)).status == SagaStatus.COMPLETED


@pytest.mark.parametrize("how", ["xtrim", "xdel"])
@pytest.mark.parametrize("where", ["command", "inbox"])
async def test_pending_entry_trimmed_or_deleted_is_reported_lost_and_the_saga_still_ends(
    real_redis: bus.Redis, where: str, how: str
) -> None:
    rig = await Rig.create(real_redis)
    await rig.client.start(order_fulfilment, order(1), saga_id="s1")
    if where == "command":  # the inventory worker that read the command dies
        stream, group = INVENTORY, "inventory"
    else:  # the inventory replies; the orchestrator that read the reply dies
        await rig.participants.run_until_idle()
        stream, group = INBOX, ORCHESTRATOR
    [entry_id] = await read_as(real_redis, stream, group, "dead")
    await age_pending(real_redis, stream, group, entry_id, CONFIG.bus.lease_ms)
    if how == "xtrim":
        await real_redis.xtrim(stream.key, maxlen=0)
    else:
        await real_redis.xdel(stream.key, entry_id)

    await rig.run()  # the reclaimer meets the deleted entry

    [letter] = await letters(real_redis)
    assert (letter["stream"], letter["entry"], letter["group"]) == (stream.key, entry_id, group)
    assert letter["raw_missing"] == "1"
    assert "deleted or trimmed while pending" in letter["reason"]
    assert rig.incidents()["entry_lost"] == 1
    assert (await rig.state("s1")).steps["reserve_stock"].status == "dispatched"

    await finish_after_timeout(rig, "s1")  # G1
    attempts = (await rig.state("s1")).steps["reserve_stock"].attempts
    assert [(a.n, a.outcome) for a in attempts] == [(1, "timeout"), (2, "ok")]
    # G2: one reservation (the idempotency key is stable across attempts), applied once
    assert len(rig.inventory.effects) == 1
    assert sum(rig.inventory.calls.values()) == 1  # the lost reply's result was recorded and reused
    assert await rig.pending() == 0  # G7: nothing left pending


async def test_bus_trimming_never_trims_an_entry_that_is_still_pending(real_redis: bus.Redis) -> None:
    rig = await Rig.create(real_redis)
    for n in range(3):
        await rig.client.start(order_fulfilment, order(n), saga_id=f"s{n}")
    held = await read_as(real_redis, INVENTORY, "inventory", "dead")  # pending, the worker died
    for entry_id in held:
        await age_pending(real_redis, INVENTORY, "inventory", entry_id, CONFIG.bus.lease_ms)

    assert await trim_stream(real_redis, INVENTORY.key, retention_ms=0) == 0
    assert [i.decode() for i, _ in await real_redis.xrange(INVENTORY.key)] == held

    await rig.run()  # the held entries are taken over and handled: nothing reported lost
    assert rig.incidents()["entry_lost"] == 0
    assert await letters(real_redis) == []
    for n in range(3):
        assert (await rig.state(f"s{n}")).status == SagaStatus.COMPLETED
    await until_redis_clock_passes_newest(real_redis, INVENTORY.key)
    assert await trim_stream(real_redis, INVENTORY.key, retention_ms=0) == 3  # all acknowledged now


async def test_consumer_deleted_while_its_handler_runs_is_detected_and_the_saga_retries(
    real_redis: bus.Redis,
) -> None:
    """``XGROUP DELCONSUMER`` drops the consumer's pending entries: nobody will deliver them again.

    The lease keeper finds the lease gone, abandons the handler and releases its in-flight
    marker, so the step's retry (after its timeout) runs at once instead of waiting out the
    marker as "another delivery with the same key is in flight".
    """
    rig = await Rig.create(real_redis)
    rig.inventory.gate = anyio.Event()
    await rig.client.start(order_fulfilment, order(1), saga_id="s1")
    [reader] = [c for c in rig.participants.consumers if c.stream == INVENTORY]
    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.participants.run_until_idle)
        with anyio.fail_after(10):
            await rig.inventory.held.wait()
        [delivery] = [d for d in reader.inflight.values() if d is not None]
        await real_redis.xgroup_delconsumer(INVENTORY.key, "inventory", rig.participants.consumer)
        assert await reader.heartbeat([delivery]) == [delivery]  # what the lease keeper does
    assert rig.incidents()["lease_lost"] == 1
    assert await rig.pending() == 0  # the entry is in nobody's pending list any more

    rig.inventory.gate = None
    await rig.run()
    assert (await rig.state("s1")).steps["reserve_stock"].status == "dispatched"
    await finish_after_timeout(rig, "s1")
    attempts = (await rig.state("s1")).steps["reserve_stock"].attempts
    assert [(a.n, a.outcome) for a in attempts] == [(1, "timeout"), (2, "ok")]
    assert len(rig.inventory.effects) == 1  # G2
    assert await letters(real_redis) == []


async def test_dead_consumer_deleted_with_pending_entries_the_step_timeout_ends_the_saga(
    real_redis: bus.Redis,
) -> None:
    """Deleting a dead worker's consumer drops its entries without any error a worker could see.

    Only the saga can tell: the step times out and its retry re-dispatches the command.
    """
    rig = await Rig.create(real_redis)
    await rig.client.start(order_fulfilment, order(1), saga_id="s1")
    await read_as(real_redis, INVENTORY, "inventory", "dead")
    await real_redis.xgroup_delconsumer(INVENTORY.key, "inventory", "dead")
    await rig.run()
    assert (await rig.state("s1")).steps["reserve_stock"].status == "dispatched"
    await finish_after_timeout(rig, "s1")
    attempts = (await rig.state("s1")).steps["reserve_stock"].attempts
    assert attempts[0].error == f"no reply within {STEP_TIMEOUT_S}s"  # the report: in the saga's record
    assert await rig.pending() == 0


@pytest.mark.parametrize("where", ["command", "inbox"])
async def test_group_destroyed_while_workers_run_is_recreated_and_every_saga_ends(
    real_redis: bus.Redis, where: str
) -> None:
    config = EngineConfig(bus=BusConfig(lease_ms=10_000, block_ms=100))
    rig = await Rig.create(real_redis, config)
    stream, group = (INVENTORY, "inventory") if where == "command" else (INBOX, ORCHESTRATOR)
    committed = anyio.Event()
    rig.orchestrator.observe(lambda _state: committed.set())
    sagas = [f"s{n}" for n in range(20)]

    async def all_ended() -> bool:
        return all([(await rig.state(s)).status.terminal for s in sagas]) and await rig.pending() == 0

    async with anyio.create_task_group() as tg:
        tg.start_soon(rig.orchestrator.run)
        tg.start_soon(rig.participants.run)
        await rig.orchestrator.started.wait()
        await rig.participants.started.wait()
        for n, saga_id in enumerate(sagas):
            await rig.client.start(order_fulfilment, order(n), saga_id=saga_id)
        with anyio.fail_after(10):
            await committed.wait()  # sagas are in flight
        await real_redis.xgroup_destroy(stream.key, group)
        # A commit or completion that met the group gone failed transiently; its retry comes
        # with the reclaimer, so the workers' clock moves on a reclaim interval at a time
        # (never as far as the steps' timeout: no step may be retried for this).
        reclaim_s = config.bus.reclaim_interval_ms / 1000
        for _ in range(int(STEP_TIMEOUT_S / reclaim_s) - 1):
            if await holds_within(all_ended, 3):
                break
            rig.clock.advance(reclaim_s)
        assert await all_ended(), "every saga ended, nothing pending"
        rig.orchestrator.stop()
        rig.participants.stop()

    assert rig.incidents()["group_recreated"] >= 1
    for saga_id in sagas:
        state = await rig.state(saga_id)
        assert state.status == SagaStatus.COMPLETED  # G1
        for step in state.steps.values():  # G4: re-delivered replies moved nothing twice
            assert [a.outcome for a in step.attempts] == ["ok"]
    assert len(rig.inventory.effects) == len(sagas)  # G2
    assert await rig.pending() == 0  # G7


async def test_stream_deleted_under_a_blocked_reader_wakes_it_and_the_group_is_recreated(
    real_redis: bus.Redis,
) -> None:
    """Redis 7.0 wakes a reader blocked on a deleted stream with ``UNBLOCKED``; it must not wait
    out its block (nor take it for a failure and back off): it recreates the group at once."""
    effects: list[str] = []
    # the block is far longer than the test's bound: only the server's wake-up ends it
    app = payments_app(effects, idempotent=False)  # an idempotent group waits in XREAD: below
    worker = Worker(real_redis, app, config=BusConfig(block_ms=4_500))
    stream = worker.consumers[0].stream
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await worker.started.wait()
            await publish_charge(real_redis, "o1")
            await eventually(lambda: effects == ["o1"], 10, "o1 was handled")
            await eventually(blocked_reader(real_redis), 10, "the reader blocks again")

            await real_redis.delete(stream.key)

            await eventually(lambda: worker.incidents["group_recreated"] == 1, 10, "the group was recreated")
            await publish_charge(real_redis, "o2")
            await eventually(lambda: effects == ["o1", "o2"], 10, "o2 was handled")
            worker.stop()
    [report] = [log for log in logs if log.get("incident") == "group_recreated"]
    assert report["event"].startswith("stream deleted")
    assert report["error"].startswith("UNBLOCKED")  # woken by the deletion, not by its timeout
    assert report["log_level"] == "error"


async def test_stream_deleted_under_an_idempotent_reader_is_found_by_the_next_entry_added(
    real_redis: bus.Redis,
) -> None:
    """An idempotent group waits in ``XREAD`` (it consumes nothing; its read and claim follow in
    the same write, ``bus/_intake.py``), which Redis does not wake when the stream is deleted.
    Nothing is waiting then; the next entry added makes the stream again and wakes it, its read
    meets ``NOGROUP``, and the group is recreated from ``0`` at once: the entry is handled well
    within the block."""
    effects: list[str] = []
    worker = Worker(real_redis, payments_app(effects), config=BusConfig(block_ms=4_500))
    stream = worker.consumers[0].stream
    with structlog.testing.capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await worker.started.wait()
            await publish_charge(real_redis, "o1")
            await eventually(lambda: effects == ["o1"], 10, "o1 was handled")
            await eventually(blocked_reader(real_redis, "xread"), 10, "the reader waits again")

            await real_redis.delete(stream.key)
            await publish_charge(real_redis, "o2")

            with anyio.fail_after(3):  # under the block: the entry woke the reader
                await eventually(lambda: effects == ["o1", "o2"], 10, "o2 was handled")
            worker.stop()
    [report] = [log for log in logs if log.get("incident") == "group_recreated"]
    assert report["event"].startswith("consumer group vanished")
    assert report["error"].startswith("NOGROUP")


def blocked_reader(redis: bus.Redis, command: str = "xreadgroup") -> Callable[[], Awaitable[bool]]:
    """A check: is a client of this test's database blocked in ``command``?"""

    async def check() -> bool:
        clients = await redis.client_list()
        db = redis.connection_pool.connection_kwargs.get("db", 0)
        return any(c["cmd"] == command and c["flags"] == "b" and int(c["db"]) == db for c in clients)

    return check


async def test_a_step_whose_every_command_is_lost_dead_letters_the_saga_and_cancel_compensates(
    real_redis: bus.Redis,
) -> None:
    """Lose each of ``charge_payment``'s five attempts while pending: every loss is a letter
    (G7); when the retries run out the saga is dead-lettered with the step's error, never
    compensated blind (a timed-out charge may have happened); an operator's cancel then
    undoes the completed ``reserve_stock`` once (G1, G3)."""
    rig = await Rig.create(real_redis)
    payments = PARTITION.commands("payments")
    await rig.client.start(order_fulfilment, order(1), saga_id="s1")
    await rig.participants.run_until_idle()  # reserve_stock
    await rig.orchestrator.run_until_idle()  # -> charge_payment, attempt 1
    lost = []
    for _ in range(RETRY.attempts):
        [entry_id] = await read_as(real_redis, payments, "payments", "dead")
        await age_pending(real_redis, payments, "payments", entry_id, CONFIG.bus.lease_ms)
        await real_redis.xdel(payments.key, entry_id)
        lost.append(entry_id)
        await rig.participants.run_until_idle()  # the reclaimer reports it lost
        rig.clock.advance(STEP_TIMEOUT_S + 1)
        await rig.orchestrator.run_until_idle()  # the step times out
        rig.clock.advance(1)
        await rig.orchestrator.run_until_idle()  # the retry is dispatched (until none is left)

    state = await rig.state("s1")
    assert state.status == SagaStatus.DEAD_LETTERED
    assert state.error is not None
    assert (state.error.step, state.error.what) == ("charge_payment", f"do attempt {RETRY.attempts} timeout")
    assert [a.outcome for a in state.steps["charge_payment"].attempts] == ["timeout"] * RETRY.attempts
    assert sorted(letter["entry"] for letter in await letters(real_redis)) == sorted(lost)
    assert rig.incidents()["entry_lost"] == RETRY.attempts

    await rig.client.cancel("s1", reason="the charge never reached payments")
    await rig.run()
    assert (await rig.state("s1")).status == SagaStatus.CANCELLED
    assert sorted(rig.inventory.effects.values()) == ["o1", "r-o1"]  # reserved, released once
    assert sum(rig.inventory.calls.values()) == 2
    assert await rig.pending() == 0
