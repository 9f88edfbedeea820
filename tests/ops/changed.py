"""Deliberately changed copies of the demo saga: what replay must catch, naming the step."""

from __future__ import annotations

from redsaga.examples import orders
from redsaga.examples.contracts import ORDERS, ChargeCard, Order
from saga import Command, Saga, StepContext, command


def _base(*, extra_step: bool = False) -> Saga[Order]:
    changed = Saga("order_fulfilment", version=1, context=ORDERS, data=Order)
    changed.step(reply=orders.StockReserved, compensate="release_stock", retry=orders.RETRY, timeout=30)(
        orders.reserve_stock.function
    )
    if extra_step:

        @changed.step(reply=orders.CardCharged, retry=orders.RETRY, timeout=30)
        def check_fraud(order: Order) -> Command:
            return command(
                "payments",
                ChargeCard(order_id=order.id, customer=order.customer, amount_cents=0, card=order.card),
            )

    return changed


def _finish(changed: Saga[Order], charge_builder: object) -> Saga[Order]:
    changed.step(
        reply=orders.CardCharged,
        compensate="refund_payment",
        retry=orders.RETRY,
        timeout=30,
        name="charge_payment",
    )(
        charge_builder  # type: ignore[arg-type]
    )
    changed.step(reply=orders.ShipmentArranged, retry=orders.RETRY, timeout=30)(
        orders.arrange_shipping.function
    )

    @changed.compensation()
    def release_stock(order: Order, ctx: StepContext) -> Command:
        return orders.release_stock.function(order, ctx)  # type: ignore[no-any-return]

    @changed.compensation()
    def refund_payment(order: Order, ctx: StepContext) -> Command:
        return orders.refund_payment.function(order, ctx)  # type: ignore[no-any-return]

    changed.validate()
    return changed


def charging_a_cent_more() -> Saga[Order]:
    """charge_payment's command carries a different amount."""

    def charge_payment(order: Order) -> Command:
        charge = orders.charge_payment.function(order)
        message = charge.message
        return command(
            "payments",
            ChargeCard(
                order_id=message.order_id,
                customer=message.customer,
                amount_cents=message.amount_cents + 1,
                card=message.card,
                flaky=message.flaky,
            ),
        )

    return _finish(_base(), charge_payment)


def with_a_fraud_check() -> Saga[Order]:
    """A new step between reserve_stock and charge_payment, in the same version."""
    return _finish(_base(extra_step=True), orders.charge_payment.function)
