"""Version 2 of order fulfilment: a fraud check before charging (docs/versioning.md's example).

Inserting a step before existing ones changes where running sagas are, so it cannot go into
version 1; version 2 runs beside version 1 until version 1's sagas have ended or been
migrated. The migration moves version 1 sagas that have not been charged yet onto version 2
(they run the fraud check next); those already past it skip the check.
"""

from __future__ import annotations

import msgspec

from bus import PermanentError
from redsaga.examples.contracts import (
    ORDERS,
    ArrangeShipping,
    CardCharged,
    ChargeCard,
    Order,
    RefundCard,
    ReleaseStock,
    ReserveStock,
    ShipmentArranged,
    StockReserved,
)
from redsaga.examples.orders import RETRY, order_fulfilment
from saga import App, Command, Instance, Plan, Saga, StepContext, command, migration

FRAUD_LIMIT_CENTS = 500_000


class FraudVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """What the fraud check decided (kept in the saga's history)."""

    score: int


order_fulfilment_v2 = Saga("order_fulfilment", version=2, context=ORDERS, data=Order)


@order_fulfilment_v2.step(reply=StockReserved, compensate="release_stock", retry=RETRY, timeout=30)
def reserve_stock(order: Order) -> Command:
    """Reserve every line of the order."""
    return command("inventory", ReserveStock(order_id=order.id, lines=order.lines, flaky=order.flaky))


@order_fulfilment_v2.action()
async def check_fraud(order: Order) -> FraudVerdict:
    """Refuse very large orders (a permanent failure: the reservation is released)."""
    if order.total_cents > FRAUD_LIMIT_CENTS:
        raise PermanentError(f"order {order.id} is over the fraud limit")
    return FraudVerdict(score=order.total_cents * 100 // FRAUD_LIMIT_CENTS)


@order_fulfilment_v2.step(reply=CardCharged, compensate="refund_payment", retry=RETRY, timeout=30)
def charge_payment(order: Order) -> Command:
    """Charge the order's total to the customer's card."""
    return command(
        "payments",
        ChargeCard(
            order_id=order.id,
            customer=order.customer,
            amount_cents=order.total_cents,
            card=order.card,
            flaky=order.flaky,
        ),
    )


@order_fulfilment_v2.step(reply=ShipmentArranged, retry=RETRY, timeout=30)
def arrange_shipping(order: Order) -> Command:
    """Book a carrier."""
    return command("shipping", ArrangeShipping(order_id=order.id, region=order.region, flaky=order.flaky))


@order_fulfilment_v2.compensation()
def release_stock(_order: Order, ctx: StepContext) -> Command:
    """Release the reservation made by ``reserve_stock``."""
    return command("inventory", ReleaseStock(reservation_id=ctx.output(reserve_stock).reservation_id))


@order_fulfilment_v2.compensation()
def refund_payment(_order: Order, ctx: StepContext) -> Command:
    """Refund the charge made by ``charge_payment``."""
    charge = ctx.output(charge_payment)
    return command("payments", RefundCard(charge_id=charge.charge_id, amount_cents=charge.amount_cents))


@migration(order_fulfilment, order_fulfilment_v2)
def fraud_check_for_running_orders(instance: Instance[Order]) -> Plan:
    """Orders not charged yet run the fraud check next; the others skip it."""
    if instance.current in (None, "reserve_stock"):
        return Plan(reason="fraud check added")
    return Plan(skip=["check_fraud"], reason="fraud check added; already past it")


app = App(
    "orders",
    sagas=[order_fulfilment, order_fulfilment_v2],
    migrations=[fraud_check_for_running_orders],
)
"""The orders service once version 2 is out: it serves both versions until version 1 is empty."""
