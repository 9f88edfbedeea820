"""The demo saga driven into every state, for the operations tests (and docs/operations.md).

In-memory participants with switches decide each order's fate by its fields:

- ``customer="no-stock"``: inventory refuses for good -> ``failed`` (nothing to undo);
- ``card="declined"``: payments refuses for good -> ``compensated`` (stock released);
- ``region="down"``: the carrier API fails transiently until :data:`FIXED` names the order
  -> ``dead_lettered`` once shipping's 5 attempts are spent;
- ``region="nowhere"`` with ``customer="refund-down"``: shipping refuses for good and
  every refund fails transiently -> ``dead_lettered`` in compensation;
- a saga whose first command is deleted before inventory sees it -> ``running`` and stuck;
- a saga cancelled right after it started -> ``cancelled``.

The clock is a :class:`bus.FakeClock` set two hours in the past, so by the real clock
(what the CLI reads) the stuck sagas have not moved for well over ten minutes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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
from saga import App, CommandContext, EngineConfig, Participant, SagaClient, SagaStatus, SagaWorker
from saga.store.codec import decode_state
from saga.store.keys import Partition
from tests.helpers import envelope_items

PARTITION = Partition("orders", 0)
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))
FIXED: set[str] = set()
"""Orders whose carrier (or refund) trouble an engineer has fixed."""
_REFUND_DOWN: set[str] = set()

inventory = Participant("inventory", serves=[ORDERS])
payments = Participant("payments", serves=[ORDERS])
shipping = Participant("shipping", serves=[ORDERS])


@inventory.handles(ReserveStock)
async def reserve(command: ReserveStock, ctx: CommandContext) -> StockReserved:
    if command.order_id.endswith("no-stock"):
        raise PermanentError(f"sku {command.lines[0].sku} is out of stock")
    return StockReserved(reservation_id=derived_id(ctx.idempotency_key, "r")[:12])


@inventory.handles(ReleaseStock)
async def release(command: ReleaseStock, ctx: CommandContext) -> StockReleased:
    return StockReleased(reservation_id=command.reservation_id)


@payments.handles(ChargeCard)
async def charge(command: ChargeCard, ctx: CommandContext) -> CardCharged:
    if command.card == "declined":
        raise PermanentError(f"card of {command.customer} declined")
    if command.customer == "refund-down":
        _REFUND_DOWN.add(derived_id(ctx.idempotency_key, "c")[:12])
    return CardCharged(charge_id=derived_id(ctx.idempotency_key, "c")[:12], amount_cents=command.amount_cents)


@payments.handles(RefundCard)
async def refund(command: RefundCard, ctx: CommandContext) -> CardRefunded:
    if command.charge_id in _REFUND_DOWN and ctx.saga_id not in FIXED:
        raise TransientError("payment gateway timeout <- ConnectionResetError: peer reset")
    return CardRefunded(refund_id=derived_id(ctx.idempotency_key, "f")[:12])


@shipping.handles(ArrangeShipping)
async def arrange(command: ArrangeShipping, ctx: CommandContext) -> ShipmentArranged:
    if command.region == "nowhere":
        raise PermanentError(f"no carrier ships to {command.region!r}")
    if command.region == "down" and ctx.saga_id not in FIXED:
        raise TransientError("carrier API returned 503")
    return ShipmentArranged(tracking=derived_id(ctx.idempotency_key, "t")[:10])


app = App("ops-tests", sagas=[order_fulfilment], participants=[inventory, payments, shipping])


def order(name: str, **fields: object) -> Order:
    return Order(
        id=name,
        customer=str(fields.pop("customer", "c-1")),
        lines=[Line(sku="sku-7", quantity=2)],
        total_cents=4200,
        **fields,  # type: ignore[arg-type]
    )


ORDERS_BY_STATE = {
    "completed": order("ord-completed"),
    "compensated": order("ord-compensated", card="declined"),
    "failed": order("ord-no-stock"),
    "dead_lettered": order("ord-dead", region="down"),
    "dead_lettered_undo": order("ord-refund-down", customer="refund-down", region="nowhere"),
    "cancelled": order("ord-cancelled"),
    "running": order("ord-stuck"),
}


@dataclass(frozen=True, slots=True)
class Scenario:
    """Where the sagas are: a saga id per state, and the clock that drove them."""

    ids: dict[str, str]
    clock: FakeClock


def two_hours_ago() -> FakeClock:
    return FakeClock(start_ms=time.time_ns() // 1_000_000 - 2 * 3_600_000)


async def drive(redis: bus.Redis, clock: FakeClock | None = None) -> Scenario:
    """Start one saga per state and run them there (nothing sleeps: the clock is advanced)."""
    clock = clock or two_hours_ago()
    FIXED.clear()
    worker = SagaWorker(redis, app, config=CONFIG, clock=clock, consumer="scenario")
    client = SagaClient(redis, app.registry, clock=clock)
    ids = {state: o.id for state, o in ORDERS_BY_STATE.items()}
    for state, one in ORDERS_BY_STATE.items():
        if state != "running":
            await client.start(order_fulfilment, one, saga_id=one.id)
    await client.cancel(ids["cancelled"], reason="customer changed their mind", by="support")
    for _ in range(40):  # retries back off up to 60 s: 40 x 15 s covers every policy here
        await worker.run_until_idle()
        clock.advance(15)
    await worker.run_until_idle()

    await client.start(order_fulfilment, ORDERS_BY_STATE["running"], saga_id=ids["running"])
    await _lose_command(redis, ids["running"])
    await worker.run_until_idle()
    await _add_bad_entries(redis, ids["running"])
    await worker.run_until_idle()

    for state, saga_id in ids.items():
        expected = SagaStatus.DEAD_LETTERED if state.startswith("dead_lettered") else SagaStatus(state)
        actual = (await client.get(saga_id)).status
        assert actual == expected, f"{saga_id}: {actual}, expected {expected}"
    return Scenario(ids=ids, clock=clock)


async def _lose_command(redis: bus.Redis, saga_id: str) -> None:
    """Delete the saga's command before inventory reads it: the saga waits for a reply."""
    stream = PARTITION.commands("inventory").key
    for entry_id, fields in await redis.xrange(stream):
        if envelope_items(fields)["corr"] == saga_id:
            await redis.xdel(stream, entry_id)


async def _add_bad_entries(redis: bus.Redis, saga_id: str) -> None:
    """Two dead letters in the partition: an entry that is no envelope, and a wrong reply."""
    await redis.xadd(PARTITION.inbox.key, {"garbage": "1"})
    raw = await redis.hgetall(PARTITION.saga(saga_id))
    state = decode_state(saga_id, raw, context=PARTITION.context, partition=PARTITION.index).state
    command_id = state.steps["reserve_stock"].attempts[0].command_id
    reply = bus.Envelope(
        id="bad-reply-1",
        type="CardRefunded",
        payload=b'{"refund_id": "x"}',
        created_at_ms=1,
        correlation_id=saga_id,
        causation_id=command_id,
        headers={"step": "reserve_stock", "kind": "do", "inc": str(state.created_ms)},
    )
    await redis.xadd(PARTITION.inbox.key, reply.to_fields())  # type: ignore[arg-type]
