"""The orders context: the order-fulfilment saga (reserve stock -> charge -> ship)."""

from __future__ import annotations

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
from saga import App, Command, Retry, Saga, StepContext, command

RETRY = Retry(attempts=5, initial=0.05, backoff=2.0, max_delay=1.0)

order_fulfilment = Saga("order_fulfilment", version=1, context=ORDERS, data=Order)


@order_fulfilment.step(reply=StockReserved, compensate="release_stock", retry=RETRY, timeout=30)
def reserve_stock(order: Order) -> Command:
    """Reserve every line of the order."""
    return command("inventory", ReserveStock(order_id=order.id, lines=order.lines, flaky=order.flaky))


@order_fulfilment.step(reply=CardCharged, compensate="refund_payment", retry=RETRY, timeout=30)
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


@order_fulfilment.step(reply=ShipmentArranged, retry=RETRY, timeout=30)
def arrange_shipping(order: Order) -> Command:
    """Book a carrier (the last step: nothing after it can fail, so no compensation)."""
    return command("shipping", ArrangeShipping(order_id=order.id, region=order.region, flaky=order.flaky))


@order_fulfilment.compensation()
def release_stock(_order: Order, ctx: StepContext) -> Command:
    """Release the reservation made by ``reserve_stock``."""
    return command("inventory", ReleaseStock(reservation_id=ctx.output(reserve_stock).reservation_id))


@order_fulfilment.compensation()
def refund_payment(_order: Order, ctx: StepContext) -> Command:
    """Refund the charge made by ``charge_payment``."""
    charge = ctx.output(charge_payment)
    return command("payments", RefundCard(charge_id=charge.charge_id, amount_cents=charge.amount_cents))


app = App("orders", sagas=[order_fulfilment])
