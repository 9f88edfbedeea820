"""Replay is exact: for random runs of the demo saga through the real store and worker,
replaying the exported trace reproduces every recorded decision and the final state; a
deliberately changed definition is reported as a mismatch naming the step.

A run draws, per step and kind, what each attempt's participant does (succeed, fail
transiently, fail for good), and a sequence of rounds: run the worker, let time pass (retry
back-offs, 30 s timeouts), lose the commands not yet read, send the last reply again, cancel,
or act as an operator (retry, force-complete, redrive). Runs use the embedded Redis (the
store's scripts are the same on real Redis; the admin tests cover that).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

import bus
from bus import FakeClock, PermanentError, TransientError, derived_id
from redsaga.examples.contracts import (
    ORDERS,
    ArrangeShipping,
    CardCharged,
    CardRefunded,
    ChargeCard,
    Line,
    Order,
    RefundCard,
    ReleaseStock,
    ReserveStock,
    ShipmentArranged,
    StockReleased,
    StockReserved,
)
from redsaga.examples.orders import order_fulfilment
from saga import App, CommandContext, Participant, SagaAdmin, SagaClient, SagaStatus, SagaWorker
from saga.core.effects import Dispatch
from saga.errors import ActionRefused
from saga.ops.trace import TraceMismatch, decode_trace, encode_trace, replay_trace
from tests.helpers import envelope_items
from tests.ops import changed
from tests.ops.scenario import CONFIG, PARTITION

SAGA_ID = "prop-1"
PLAN: dict[tuple[str, str], list[str]] = {}
"""(step, kind) -> what each attempt does, in order; then it succeeds."""
_attempts: defaultdict[tuple[str, str], int] = defaultdict(int)

inventory = Participant("inventory", serves=[ORDERS])
payments = Participant("payments", serves=[ORDERS])
shipping = Participant("shipping", serves=[ORDERS])


def _behave(ctx: CommandContext) -> None:
    key = (ctx.step, ctx.kind)
    _attempts[key] += 1
    script = PLAN.get(key, [])
    outcome = script[_attempts[key] - 1] if _attempts[key] <= len(script) else "ok"
    if outcome == "transient":
        raise TransientError(f"{ctx.step} flaked")
    if outcome == "permanent":
        raise PermanentError(f"{ctx.step} refused")


@inventory.handles(ReserveStock)
async def reserve(command: ReserveStock, ctx: CommandContext) -> StockReserved:
    _behave(ctx)
    return StockReserved(reservation_id=derived_id(ctx.idempotency_key, "r")[:8])


@inventory.handles(ReleaseStock)
async def release(command: ReleaseStock, ctx: CommandContext) -> StockReleased:
    _behave(ctx)
    return StockReleased(reservation_id=command.reservation_id)


@payments.handles(ChargeCard)
async def charge(command: ChargeCard, ctx: CommandContext) -> CardCharged:
    _behave(ctx)
    return CardCharged(charge_id=derived_id(ctx.idempotency_key, "c")[:8], amount_cents=command.amount_cents)


@payments.handles(RefundCard)
async def refund(command: RefundCard, ctx: CommandContext) -> CardRefunded:
    _behave(ctx)
    return CardRefunded(refund_id="f")


@shipping.handles(ArrangeShipping)
async def arrange(command: ArrangeShipping, ctx: CommandContext) -> ShipmentArranged:
    _behave(ctx)
    return ShipmentArranged(tracking="t")


app = App("property", sagas=[order_fulfilment], participants=[inventory, payments, shipping])
FORCED = {
    "reserve_stock": {"reservation_id": "forced"},
    "charge_payment": {"charge_id": "forced", "amount_cents": 1},
    "arrange_shipping": {"tracking": "forced"},
}

outcomes = st.lists(st.sampled_from(["ok", "transient", "transient", "permanent"]), max_size=6)
plans = st.fixed_dictionaries(
    {
        (step, kind): outcomes
        for step in ("reserve_stock", "charge_payment", "arrange_shipping")
        for kind in ("do", "undo")
        if not (step == "arrange_shipping" and kind == "undo")
    }
)
rounds = st.lists(
    st.sampled_from(
        ["run", "wait", "wait", "timeout", "lose", "duplicate", "cancel", "operator", "operator"]
    ),
    min_size=3,
    max_size=25,
)


async def _lose_unread(redis: bus.Redis) -> None:
    """Delete every command no participant has read yet: those attempts will time out."""
    for participant in ("inventory", "payments", "shipping"):
        key = PARTITION.commands(participant).key
        groups = await redis.xinfo_groups(key) if await redis.exists(key) else []
        last = groups[0]["last-delivered-id"] if groups else b"0-0"
        for entry_id, _ in await redis.xrange(key, f"({last.decode()}", "+"):
            await redis.xdel(key, entry_id)


async def _duplicate_last_reply(redis: bus.Redis) -> None:
    for _, fields in reversed(await redis.xrange(PARTITION.inbox.key)):
        if envelope_items(fields)["cause"]:
            await redis.xadd(PARTITION.inbox.key, fields)
            return


async def _operate(admin: SagaAdmin, choice: int) -> None:
    state = await admin.get(SAGA_ID)
    current = order_fulfilment.steps[min(state.cursor, len(order_fulfilment.steps) - 1)].name
    try:
        if choice == 0:
            await admin.retry(SAGA_ID, reason="r")
        elif choice == 1:
            undo = next((n for n, s in state.steps.items() if s.status == "compensation_failed"), None)
            step, output = (undo, {"undone": True}) if undo else (current, FORCED[current])
            await admin.force_complete(SAGA_ID, step, output, reason="r")
        else:
            await admin.redrive(SAGA_ID, current, reason="r")
    except ActionRefused as refused:
        note(f"refused: {refused.reason}")


async def _run(plan: dict[tuple[str, str], list[str]], steps: list[str]) -> bytes:
    PLAN.clear()
    PLAN.update(plan)
    _attempts.clear()
    redis = bus.connect(bus.MEMORY_URL)
    clock = FakeClock()
    worker = SagaWorker(redis, app, config=CONFIG, clock=clock, consumer="w")
    admin = SagaAdmin(redis, app, clock=clock, by="op", wait_s=0)
    order = Order(id="o", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=100)
    await SagaClient(redis, app.registry, clock=clock).start(order_fulfilment, order, saga_id=SAGA_ID)
    await worker.bus_worker.setup()
    for n, step in enumerate(steps):
        if step == "wait":
            clock.advance(2)
        elif step == "timeout":
            clock.advance(61)
        elif step == "lose":
            await _lose_unread(redis)
        elif step == "duplicate":
            await _duplicate_last_reply(redis)
        elif step == "cancel":
            await admin.client.cancel(SAGA_ID, reason="r", by="op")
        elif step == "operator":
            await _operate(admin, n % 3)
        await worker.run_until_idle()
    for _ in range(30):  # let it settle: retries and timeouts run out
        clock.advance(61)
        await worker.run_until_idle()
    report = await admin.replay(SAGA_ID)
    assert report.ok, report.mismatch and report.mismatch.message
    assert report.matched == report.entries
    trace = encode_trace(await admin.export(SAGA_ID))
    await redis.aclose()
    return trace


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
@given(plan=plans, steps=rounds)
def test_replaying_an_exported_run_reproduces_every_decision(
    plan: dict[tuple[str, str], list[str]], steps: list[str]
) -> None:
    trace = anyio.run(_run, plan, steps)
    state = replay_trace(trace, app)  # every decision, then the final state
    event(f"ended {state.status}")
    event(f"{len(_history(trace))} history entries" if len(_history(trace)) < 10 else "10+ history entries")
    charged = any(
        isinstance(effect, Dispatch) and effect.step == "charge_payment" and effect.kind == "do"
        for entry in _history(trace)
        for effect in entry.effects
    )
    if charged:
        with pytest.raises(TraceMismatch) as failure:
            replay_trace(trace, changed.charging_a_cent_more())
        assert failure.value.mismatch is not None
        assert failure.value.mismatch.step == "charge_payment"
    else:
        replay_trace(trace, changed.charging_a_cent_more())  # the change never mattered to this run
    assert state.status in set(SagaStatus)


def _history(trace: bytes) -> Any:
    return decode_trace(trace).history
