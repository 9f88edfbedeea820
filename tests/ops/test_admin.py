"""The admin client on real Redis, against sagas driven into every state."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TypeVar

import anyio
import msgspec
import pytest

import bus
import relay
from bus import FakeClock, LetterFilter
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from saga import (
    App,
    EngineConfig,
    InvalidInput,
    SagaAdmin,
    SagaClient,
    SagaExists,
    SagaNotFound,
    SagaStatus,
    SagaWorker,
    StartConflict,
    StepStatus,
)
from saga.core.effects import Dispatch
from saga.core.history_entry import HistoryEntry
from saga.core.model import SagaState
from saga.errors import ActionRefused, UnknownDefinition
from saga.ops.operator_actions import ActionResult
from saga.ops.trace import replay_trace
from saga.store.commit import command_envelope
from saga.store.keys import Partition
from tests.helpers import eventually, raw_items, while_deciding
from tests.ops.live import LIVE_CONFIG
from tests.ops.scenario import CONFIG, FIXED, PARTITION, Scenario, app, drive

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
T = TypeVar("T")
SHIPPED = {"tracking": "manual-42"}


@pytest.fixture
async def scenario(real_redis: bus.Redis) -> AsyncIterator[Scenario]:
    yield await drive(real_redis)
    await real_redis.flushdb()  # leave no saga in flight for suites that wait for all to end


@pytest.fixture
def worker(real_redis: bus.Redis, scenario: Scenario) -> SagaWorker:
    return SagaWorker(real_redis, app, config=CONFIG, clock=scenario.clock, consumer="orchestrator-test")


@pytest.fixture
async def admin(real_redis: bus.Redis, scenario: Scenario) -> AsyncIterator[SagaAdmin]:
    yield SagaAdmin(real_redis, app, by="alice@ops", wait_s=10)


async def inbox_and_history(redis: bus.Redis, saga_id: str) -> tuple[int, int]:
    return await redis.xlen(PARTITION.inbox.key), await redis.llen(PARTITION.history(saga_id))


# -- reading ------------------------------------------------------------------------------------


async def test_inspect_explains_each_state(admin: SagaAdmin, scenario: Scenario) -> None:
    ids = scenario.ids
    stuck = await admin.inspect(ids["running"])
    assert stuck.status == SagaStatus.RUNNING
    assert stuck.current_step == "reserve_stock"
    assert stuck.waiting_for.startswith("a reply from inventory to ReserveStock (reserve_stock/do attempt 1")
    assert "times out in" in stuck.waiting_for or "timeout overdue" in stuck.waiting_for
    [timer] = stuck.timers
    assert (timer.purpose, timer.step, timer.attempt) == ("timeout", "reserve_stock", 1)
    assert stuck.idle_ms > 3_600_000
    [letter] = stuck.dead_letters
    assert "reserve_stock expects a StockReserved reply, got CardRefunded" in letter.reason
    assert [s.name for s in stuck.steps] == ["reserve_stock", "charge_payment", "arrange_shipping"]

    dead = await admin.inspect(ids["dead_lettered"])
    assert dead.current_step == "arrange_shipping"
    assert "an operator: arrange_shipping ran out of attempts" in dead.waiting_for
    assert dead.error_chain == ["TransientError: carrier API returned 503"]
    shipping = dead.steps[2]
    assert [a.outcome for a in shipping.attempts] == ["transient"] * 5
    assert all(a.worker == "scenario" for a in shipping.attempts)

    undo = await admin.inspect(ids["dead_lettered_undo"])
    assert undo.current_step == "charge_payment"
    assert "the compensation of charge_payment ran out of attempts" in undo.waiting_for
    assert undo.error_chain == ["TransientError: payment gateway timeout", "ConnectionResetError: peer reset"]

    done = await admin.inspect(ids["completed"], history=True)
    assert done.waiting_for == "nothing: the saga ended (completed)"
    assert [row.event for row in done.timeline] == ["started", "replied", "replied", "replied"]
    assert done.timeline[0].effects == [
        "send reserve_stock/do #1 to inventory",
        "timeout timer reserve_stock/do in 30.0s",
    ]
    assert len(done.history) == 4
    assert (await admin.inspect(ids["completed"])).history == []


async def test_inspect_of_an_unknown_saga_says_so(admin: SagaAdmin) -> None:
    with pytest.raises(SagaNotFound, match="no saga with id 'nope'"):
        await admin.inspect("nope")


async def test_list_by_status_definition_and_version(admin: SagaAdmin, scenario: Scenario) -> None:
    ids = scenario.ids
    for status in ("completed", "compensated", "failed", "cancelled", "running"):
        page = await admin.list(status=status)
        assert [r.id for r in page.rows] == [ids[status]], status
    dead = await admin.list(status="dead_lettered")
    assert {r.id for r in dead.rows} == {ids["dead_lettered"], ids["dead_lettered_undo"]}
    assert len((await admin.list(definition="order_fulfilment", version=1)).rows) == 7
    with pytest.raises(UnknownDefinition, match="no definition named 'other' \\(known: order_fulfilment\\)"):
        await admin.list(definition="other")
    with pytest.raises(UnknownDefinition, match="no definition named 'other'"):
        await admin.tally(definition="other", stuck_for_ms=0)
    assert (await admin.list(version=2)).rows == []
    assert await admin.count(status="dead_lettered") == 2
    assert await admin.count() == 7
    with pytest.raises(InvalidInput, match="unknown status"):
        await admin.list(status="stuck")


async def test_list_stuck_sagas_stalest_first_and_paginated(admin: SagaAdmin, scenario: Scenario) -> None:
    ids = scenario.ids
    stuck = await admin.list(stuck_for_ms=10 * 60_000)
    assert [r.id for r in stuck.rows][-1] == ids["running"]  # it moved last
    assert {r.id for r in stuck.rows} == {ids["running"], ids["dead_lettered"], ids["dead_lettered_undo"]}
    assert [r.since_ms for r in stuck.rows] == sorted(r.since_ms for r in stuck.rows)
    assert all(r.idle_ms > 10 * 60_000 for r in stuck.rows)
    first = await admin.list(stuck_for_ms=10 * 60_000, limit=2)
    assert first.next_offset == 2
    rest = await admin.list(stuck_for_ms=10 * 60_000, limit=2, offset=2)
    assert rest.next_offset is None
    assert [r.id for r in first.rows + rest.rows] == [r.id for r in stuck.rows]
    assert await admin.count(stuck_for_ms=10 * 60_000) == 3
    assert (await admin.list(stuck_for_ms=10 * 60_000, status="running")).rows[0].id == ids["running"]
    assert (await admin.list(stuck_for_ms=24 * 3_600_000)).rows == []


async def test_every_saga_replays_exactly_and_its_export_replays_in_ci(
    admin: SagaAdmin, scenario: Scenario
) -> None:
    for saga_id in scenario.ids.values():
        report = await admin.replay(saga_id)
        assert report.ok, report.mismatch and report.mismatch.message
        assert report.matched == report.entries
        trace = await admin.export(saga_id)
        assert trace.steps == ["reserve_stock", "charge_payment", "arrange_shipping"]
        state = replay_trace(msgspec.json.encode(trace), app)
        assert state.status == trace.state.status


# -- acting -------------------------------------------------------------------------------------


async def test_force_complete_a_dead_lettered_step(
    admin: SagaAdmin, worker: SagaWorker, scenario: Scenario, real_redis: bus.Redis
) -> None:
    saga_id = scenario.ids["dead_lettered"]
    result = await while_deciding(
        worker,
        admin.force_complete(
            saga_id, "arrange_shipping", msgspec.json.encode(SHIPPED), reason="booked by phone"
        ),
    )
    assert (result.outcome, result.status, result.by) == ("applied", SagaStatus.COMPLETED, "alice@ops")
    state = await admin.get(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert (
        bytes(state.steps["arrange_shipping"].output) == b'{"type":"ShipmentArranged","tracking":"manual-42"}'
    )
    forced = state.steps["arrange_shipping"].attempts[-1]
    assert (forced.outcome, forced.worker, forced.participant) == ("forced", "alice@ops", "operator")
    assert state.error is not None  # the note is the operator's, as after a retry
    assert (state.error.what, state.error.by, state.error.reason, state.error.step) == (
        "operator force-complete",
        "alice@ops",
        "booked by phone",
        "arrange_shipping",
    )
    assert (await admin.replay(saga_id)).ok


@pytest.mark.parametrize(
    ("step", "output", "message"),
    [
        ("arrange_shipping", b"{not json", "the output is not valid JSON"),
        ("arrange_shipping", b'{"tracking": 5}', "not a valid ShipmentArranged"),
        ("arrange_shipping", b'{"type": "CardCharged", "tracking": "x"}', "not a valid ShipmentArranged"),
        ("ship_it", b"{}", "unknown step 'ship_it' in order_fulfilment@1"),
        ("reserve_stock", b'{"reservation_id": "r"}', "is not the step the saga is stuck on"),
    ],
)
async def test_force_complete_refuses_bad_input_and_changes_nothing(
    admin: SagaAdmin, scenario: Scenario, real_redis: bus.Redis, *, step: str, output: bytes, message: str
) -> None:
    saga_id = scenario.ids["dead_lettered"]
    before = await inbox_and_history(real_redis, saga_id)
    with pytest.raises((InvalidInput, ActionRefused), match=message):
        await admin.force_complete(saga_id, step, output, reason="test")
    assert await inbox_and_history(real_redis, saga_id) == before
    with pytest.raises(InvalidInput, match="needs a reason"):
        await admin.force_complete(saga_id, "arrange_shipping", SHIPPED, reason=" ")


async def test_retry_after_the_fix_completes_and_a_retry_that_cannot_apply_is_refused(
    admin: SagaAdmin, worker: SagaWorker, scenario: Scenario, real_redis: bus.Redis
) -> None:
    saga_id = scenario.ids["dead_lettered"]
    FIXED.add(saga_id)
    result = await while_deciding(worker, admin.retry(saga_id, reason="carrier back"))
    assert result.dispatched == ["arrange_shipping/do #6 -> shipping ArrangeShipping"]
    await worker.run_until_idle()
    state = await admin.get(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert state.error is not None
    assert (state.error.what, state.error.by, state.error.reason) == (
        "operator retry",
        "alice@ops",
        "carrier back",
    )

    completed = scenario.ids["completed"]
    before = await inbox_and_history(real_redis, completed)
    with pytest.raises(ActionRefused, match="retry applies to dead-lettered sagas, this one is completed"):
        await admin.retry(completed)
    assert await inbox_and_history(real_redis, completed) == before


async def test_retry_of_a_dead_lettered_compensation(
    admin: SagaAdmin, worker: SagaWorker, scenario: Scenario
) -> None:
    saga_id = scenario.ids["dead_lettered_undo"]
    FIXED.add(saga_id)
    await while_deciding(worker, admin.retry(saga_id, reason="gateway back"))
    await worker.run_until_idle()
    state = await admin.get(saga_id)
    assert state.status == SagaStatus.COMPENSATED
    assert state.steps["reserve_stock"].status == StepStatus.COMPENSATED


async def test_cancel_compensates_completed_steps(
    admin: SagaAdmin, worker: SagaWorker, scenario: Scenario
) -> None:
    saga_id = scenario.ids["dead_lettered"]
    result = await while_deciding(worker, admin.cancel(saga_id, reason="order withdrawn"))
    assert result.outcome == "applied"
    await worker.run_until_idle()
    state = await admin.get(saga_id)
    assert state.status == SagaStatus.CANCELLED
    assert state.cancel is not None
    assert (state.cancel.by, state.cancel.reason) == ("alice@ops", "order withdrawn")


async def test_an_action_not_decided_in_time_is_reported_queued(admin: SagaAdmin, scenario: Scenario) -> None:
    result = await admin.cancel(scenario.ids["running"], wait_s=0.2)  # no orchestrator runs
    assert result.outcome == "queued"
    assert result.status == SagaStatus.RUNNING  # what the decider expects once it decides


async def test_redrive_a_stuck_saga_from_its_step(
    admin: SagaAdmin, worker: SagaWorker, scenario: Scenario, real_redis: bus.Redis
) -> None:
    saga_id = scenario.ids["running"]
    before = await inbox_and_history(real_redis, saga_id)
    plan = await admin.redrive(saga_id, "reserve_stock", reason="command lost", dry_run=True)
    assert (plan.outcome, plan.dispatched) == ("dry-run", ["reserve_stock/do #2 -> inventory ReserveStock"])
    assert await inbox_and_history(real_redis, saga_id) == before

    result = await while_deciding(worker, admin.redrive(saga_id, "reserve_stock", reason="command lost"))
    assert result.outcome == "applied"
    assert plan.revision == result.revision  # the store's revision rule, predicted by the dry run
    await worker.run_until_idle()
    state = await admin.get(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert [a.outcome for a in state.steps["reserve_stock"].attempts] == ["cancelled", "ok"]
    assert (await admin.replay(saga_id)).ok


async def test_redrive_after_a_fix_uses_a_fresh_key_and_refuses_ended_sagas(
    admin: SagaAdmin, worker: SagaWorker, scenario: Scenario
) -> None:
    saga_id = scenario.ids["dead_lettered"]
    FIXED.add(saga_id)
    await while_deciding(worker, admin.redrive(saga_id, "arrange_shipping", reason="carrier fixed"))
    await worker.run_until_idle()
    state = await admin.get(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert state.steps["arrange_shipping"].generation == 1
    with pytest.raises(ActionRefused, match="an ended saga is not reopened"):
        await admin.redrive(scenario.ids["failed"], "reserve_stock", reason="r")
    with pytest.raises(ActionRefused, match="no step 'nope'"):
        await admin.redrive(scenario.ids["running"], "nope", reason="r")


# -- racing a late reply --------------------------------------------------------------------------


async def _deliver_the_lost_command(redis: bus.Redis, saga_id: str) -> None:
    """The 'lost' command turns up after all: put attempt 1 back on inventory's stream."""
    state = await SagaAdmin(redis, app).get(saga_id)
    attempt = state.steps["reserve_stock"].attempts[0]
    dispatch = Dispatch(
        step="reserve_stock",
        kind="do",
        attempt=1,
        participant="inventory",
        command_id=attempt.command_id,
        message_type=attempt.input_type,
        payload=attempt.input,
    )
    envelope = command_envelope(state, dispatch, PARTITION, cause="", now_ms=1)
    await bus.Publisher(redis).publish_envelope(PARTITION.commands("inventory"), envelope)


def _act(admin: SagaAdmin, action: str, saga_id: str, wait_s: float) -> Awaitable[ActionResult]:
    if action == "force-complete":
        manual = {"reservation_id": "manual"}
        return admin.force_complete(saga_id, "reserve_stock", manual, reason="r", wait_s=wait_s)
    return admin.cancel(saga_id, reason="r", wait_s=wait_s)


async def _reply_late(redis: bus.Redis, saga_id: str, clock: FakeClock) -> None:
    """The lost command turns up and inventory replies; the reply waits in the inbox."""
    await _deliver_the_lost_command(redis, saga_id)
    participants = SagaWorker(
        redis, App("participants", participants=app.participants), config=CONFIG, clock=clock
    )
    await participants.bus_worker.run_until_idle()


@pytest.mark.parametrize("action", ["force-complete", "cancel"])
async def test_an_action_judged_before_a_late_reply_loses_with_a_clear_message(
    admin: SagaAdmin,
    worker: SagaWorker,
    scenario: Scenario,
    real_redis: bus.Redis,
    monkeypatch: pytest.MonkeyPatch,
    *,
    action: str,
) -> None:
    """The operator judged revision 1; the late reply is decided first; the action is refused."""
    saga_id = scenario.ids["running"]
    seen = await admin.get(saga_id)
    await _reply_late(real_redis, saga_id, scenario.clock)
    await worker.run_until_idle()  # the reply wins: revision 2
    assert (await admin.get(saga_id)).revision > seen.revision

    async def as_seen(_saga_id: str, _context: str | None) -> tuple[Partition, SagaState, list[HistoryEntry]]:
        return PARTITION, seen, []

    monkeypatch.setattr(admin, "_read", as_seen)  # the operator's picture from before the reply
    with pytest.raises(ActionRefused) as refused:
        await while_deciding(worker, _act(admin, action, saga_id, wait_s=10))
    assert refused.value.request_id  # recorded in the history, then ignored
    assert f"was ignored: the saga moved on: the request was made at revision {seen.revision}" in str(
        refused.value
    )
    monkeypatch.undo()
    state = await admin.get(saga_id)
    assert [a.outcome for a in state.steps["reserve_stock"].attempts] == ["ok"]
    assert state.cancel is None


@pytest.mark.parametrize("action", ["force-complete", "cancel"])
@pytest.mark.parametrize("round_", range(3))
async def test_an_action_and_a_late_reply_in_the_inbox_together_end_one_way(
    admin: SagaAdmin,
    worker: SagaWorker,
    scenario: Scenario,
    real_redis: bus.Redis,
    *,
    action: str,
    round_: int,
) -> None:
    """Both wait in the inbox and the orchestrator handles them at once: the revision check
    lets exactly one of them move the saga; the other is recorded and ignored."""
    saga_id = scenario.ids["running"]
    sent = await _act(admin, action, saga_id, wait_s=0)
    await _reply_late(real_redis, saga_id, scenario.clock)
    await worker.run_until_idle()

    history = await admin.history(saga_id)
    request = next(e for e in history if e.event.id == sent.request_id)
    reply = next(
        e for e in history if e.event.__class__.__name__ == "StepReplied" and e.event.step == "reserve_stock"
    )
    state = await admin.get(saga_id)
    reserve = [a.outcome for a in state.steps["reserve_stock"].attempts]
    if request.ignored:  # the reply won
        assert request.ignored.startswith("the saga moved on")
        assert not reply.ignored
        assert reserve == ["ok"]
        assert state.status == SagaStatus.COMPLETED
    elif action == "force-complete":  # the operator won; the reply found its attempt ended
        assert reply.ignored.startswith("late reply to reserve_stock/do attempt 1")
        assert reserve == ["cancelled", "forced"]
        assert state.status == SagaStatus.COMPLETED
    else:  # cancel won: the attempt's outcome was awaited, then undone
        assert not reply.ignored
        assert reserve == ["ok", "ok"]  # the forward attempt and its compensation
        assert state.status == SagaStatus.CANCELLED
    charges = [
        e for h in history for e in h.effects if isinstance(e, Dispatch) and e.step == "charge_payment"
    ]
    assert len(charges) == (0 if state.status == SagaStatus.CANCELLED else 1)


async def test_a_late_reply_after_force_complete_changes_nothing(
    admin: SagaAdmin, worker: SagaWorker, scenario: Scenario, real_redis: bus.Redis
) -> None:
    """The action is decided first: the late reply finds its attempt ended and is ignored."""
    saga_id = scenario.ids["running"]
    await while_deciding(
        worker, admin.force_complete(saga_id, "reserve_stock", {"reservation_id": "manual"}, reason="r")
    )
    await _deliver_the_lost_command(real_redis, saga_id)
    await worker.run_until_idle()
    state = await admin.get(saga_id)
    outcomes = [a.outcome for a in state.steps["reserve_stock"].attempts]
    assert outcomes == ["cancelled", "forced"]
    assert bytes(state.steps["reserve_stock"].output) == b'{"type":"StockReserved","reservation_id":"manual"}'
    history = await admin.history(saga_id)
    assert [e.ignored for e in history if e.ignored] == [
        "late reply to reserve_stock/do attempt 1; current is attempt 2"
    ]
    assert state.status == SagaStatus.COMPLETED


# -- dead letters, stats, start -------------------------------------------------------------------


async def test_dead_letters_list_show_requeue_and_purge(
    admin: SagaAdmin, worker: SagaWorker, real_redis: bus.Redis
) -> None:
    letters = await admin.dead_letters()
    assert letters[0].reason == "malformed entry: missing envelope fields: e, data"
    assert "reserve_stock expects a StockReserved reply, got CardRefunded" in letters[1].reason
    bad_reply = letters[1]
    assert (bad_reply.stream, bad_reply.group, bad_reply.deliveries) == (
        PARTITION.inbox.key,
        "orchestrator",
        1,
    )
    assert bad_reply.correlation_id == "ord-stuck"
    assert raw_items(bad_reply.raw)["type"] == "CardRefunded"
    assert bad_reply.headers.keys() == {"step", "kind", "inc"}
    assert (bad_reply.headers["step"], bad_reply.headers["kind"]) == ("reserve_stock", "do")
    assert await admin.dead_letter(bad_reply.id) == bad_reply
    with pytest.raises(KeyError, match="no dead letter 'not-an-id'"):
        await admin.dead_letter("not-an-id")
    assert [x.id for x in await admin.dead_letters(LetterFilter(reason="malformed"))] == [letters[0].id]
    assert await admin.dead_letters(LetterFilter(stream="cmd:payments")) == []

    inbox_before = await real_redis.xlen(PARTITION.inbox.key)
    [requeued] = await admin.requeue_dead_letters(LetterFilter(ids=(bad_reply.id,)))
    assert requeued.outcome == "requeued"
    assert await real_redis.xlen(PARTITION.inbox.key) == inbox_before + 1
    with pytest.raises(KeyError, match=f"no dead letter '{bad_reply.id}'"):  # gone: an unknown id
        await admin.requeue_dead_letters(LetterFilter(ids=(bad_reply.id,)))
    assert await real_redis.xlen(PARTITION.inbox.key) == inbox_before + 1
    await worker.run_until_idle()  # still a wrong reply: dead-lettered again, with its history
    again = await admin.dead_letters(LetterFilter(type="CardRefunded"))
    assert len(again) == 1
    assert again[0].id != bad_reply.id

    assert await admin.purge_dead_letters(LetterFilter()) == 2
    assert await admin.dead_letters() == []


async def test_stats(admin: SagaAdmin, real_redis: bus.Redis, tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'outbox.db'}"
    await relay.init_db(dsn)
    stats = await admin.stats(dsns=[dsn, f"sqlite:///{tmp_path / 'missing.db'}"])
    by_status = {c.status: c.count for c in stats.sagas}
    assert by_status == {
        SagaStatus.COMPLETED: 1,
        SagaStatus.COMPENSATED: 1,
        SagaStatus.FAILED: 1,
        SagaStatus.CANCELLED: 1,
        SagaStatus.RUNNING: 1,
        SagaStatus.DEAD_LETTERED: 2,
    }
    assert (stats.in_flight, stats.stuck) == (3, 3)
    streams = {s.stream: s for s in stats.streams}
    inventory = streams[PARTITION.commands("inventory").key]
    assert [g.group for g in inventory.groups] == ["inventory"]
    assert all(g.pending == 0 for s in stats.streams for g in s.groups)
    assert stats.dead_letters == {"rs:{orders:0}:dlq": 2}
    assert stats.outbox[0].backlog == 0
    assert stats.outbox[1].error


async def test_start_validates_data_before_writing(admin: SagaAdmin, real_redis: bus.Redis) -> None:
    keys_before = len(await real_redis.keys("*"))
    with pytest.raises(InvalidInput, match="not a valid Order"):
        await admin.start("order_fulfilment", b'{"id": "x"}')
    with pytest.raises(InvalidInput, match="not a valid Order"):
        await admin.start("order_fulfilment", b"{nope")
    assert len(await real_redis.keys("*")) == keys_before
    data = b'{"id":"o-9","customer":"c","lines":[{"sku":"s","quantity":1}],"total_cents":5}'
    assert await admin.start("order_fulfilment@1", data, saga_id="o-9") == "o-9"
    assert (await admin.get("o-9")).status == SagaStatus.RUNNING


async def test_force_complete_a_failed_compensation_then_again(
    admin: SagaAdmin, worker: SagaWorker, scenario: Scenario
) -> None:
    saga_id = scenario.ids["dead_lettered_undo"]
    result = await while_deciding(
        worker,
        admin.force_complete(saga_id, "charge_payment", {"refund_id": "by-hand"}, reason="console refund"),
    )
    assert result.dispatched == ["reserve_stock/undo #1 -> inventory ReleaseStock"]
    await worker.run_until_idle()
    state = await admin.get(saga_id)
    assert state.status == SagaStatus.COMPENSATED
    assert bytes(state.steps["charge_payment"].attempts[-1].output) == b'{"refund_id":"by-hand"}'
    with pytest.raises(ActionRefused, match="the saga has already ended \\(compensated\\)"):
        await admin.force_complete(saga_id, "charge_payment", {"refund_id": "again"}, reason="again")


async def test_an_oversized_force_complete_is_refused_before_sending(
    admin: SagaAdmin, scenario: Scenario, real_redis: bus.Redis
) -> None:
    saga_id = scenario.ids["dead_lettered"]
    before = await inbox_and_history(real_redis, saga_id)
    with pytest.raises(InvalidInput, match="over the 1048576-byte payload limit"):
        await admin.force_complete(saga_id, "arrange_shipping", {"tracking": "x" * (1 << 20)}, reason="r")
    assert await inbox_and_history(real_redis, saga_id) == before


async def test_stats_counts_only_live_consumers(real_redis: bus.Redis, scenario: Scenario) -> None:
    # the scenario's own consumer stopped; a running worker is live
    worker = SagaWorker(real_redis, app, config=LIVE_CONFIG, clock=scenario.clock, consumer="live-test")
    admin = SagaAdmin(real_redis, app, config=EngineConfig(bus=bus.BusConfig(lease_ms=1_500)))

    async def one_live_one_idle() -> bool:
        # before Redis 7.2 only a read that returns entries refreshes a consumer's idle time:
        # give the running worker something to read (an entry it dead-letters)
        await real_redis.xadd(PARTITION.commands("inventory").key, {"garbage": "1"})
        stats = await admin.stats()
        [group] = {s.stream: s for s in stats.streams}[PARTITION.commands("inventory").key].groups
        return (group.consumers, group.idle_consumers) == (1, 1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.started.wait()
        await eventually(one_live_one_idle, 30, "stats counts the running worker live, the stopped one idle")
        assert (await admin.stats()).live_after_ms == 1_500
        worker.stop()


async def test_a_start_with_other_data_is_refused(admin: SagaAdmin, real_redis: bus.Redis) -> None:
    data = b'{"id":"o-9","customer":"c","lines":[{"sku":"s","quantity":1}],"total_cents":5}'
    assert await admin.start("order_fulfilment", data, saga_id="o-9") == "o-9"
    assert await admin.start("order_fulfilment", data, saga_id="o-9") == "o-9"  # equal data: idempotent
    reordered = b'{"customer":"c","id":"o-9","total_cents":5,"lines":[{"quantity":1,"sku":"s"}]}'
    assert await admin.start("order_fulfilment", reordered, saga_id="o-9") == "o-9"
    client = SagaClient(real_redis, app.registry)
    other = Order(id="o-9", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=6)
    with pytest.raises(StartConflict) as refused:
        await client.start(order_fulfilment, other, saga_id="o-9")
    assert (refused.value.saga_id, refused.value.definition) == ("o-9", "order_fulfilment@1")
    assert isinstance(refused.value, SagaExists)
    state = await admin.get("o-9")
    assert msgspec.json.decode(state.data)["total_cents"] == 5
    [started] = (await admin.inspect("o-9")).timeline
    assert started.summary == "started by alice@ops"


async def test_inspect_names_who_replied_through_the_outbox(real_redis: bus.Redis, tmp_path: Path) -> None:
    from redsaga.examples import inventory as inventory_service
    from redsaga.examples import payments as payments_service
    from redsaga.examples.all import app as demo

    payments_service.ledger.dsn = f"sqlite:///{tmp_path / 'payments.db'}"
    inventory_service.stock.dsn = f"sqlite:///{tmp_path / 'inventory.db'}"
    for hook in demo.on_start:
        await hook()
    try:
        worker = SagaWorker(real_redis, demo, consumer="worker-7")
        order = Order(id="o1", customer="c", lines=[Line(sku="s", quantity=2)], total_cents=700)
        await SagaClient(real_redis, demo.registry).start(order_fulfilment, order, saga_id="o1")
        relays = [
            relay.Relay.connect(d, real_redis)
            for d in (payments_service.ledger.dsn, inventory_service.stock.dsn)
        ]
        for _ in range(10):
            await worker.run_until_idle()
            for one in relays:
                await one.run(drain=True)
        found = await SagaAdmin(real_redis, demo).inspect("o1")
    finally:
        for hook in demo.on_stop:
            await hook()
    assert found.status == SagaStatus.COMPLETED
    # reserve_stock and charge_payment reply through their outboxes, arrange_shipping on the bus
    assert [(s.name, s.attempts[0].outcome, s.attempts[0].worker) for s in found.steps] == [
        ("reserve_stock", "ok", "worker-7"),
        ("charge_payment", "ok", "worker-7"),
        ("arrange_shipping", "ok", "worker-7"),
    ]
    assert [r.summary for r in found.timeline[1:]] == [
        "reserve_stock/do #1 succeeded (worker-7)",
        "charge_payment/do #1 succeeded (worker-7)",
        "arrange_shipping/do #1 succeeded (worker-7)",
    ]
