"""The orders context: order fulfilment, and the approval large orders wait for.

``order_fulfilment`` reserves stock, charges the card and ships. An order above
:data:`APPROVAL_LIMIT_CENTS` runs ``large_order`` instead: a manager approves it first (a
human task for the role ``managers``, moved to ``senior-managers`` when it runs past its due
time), then it is fulfilled by ``order_fulfilment`` as a child saga.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

import msgspec

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
from saga import (
    App,
    Command,
    Escalation,
    PermanentError,
    Retry,
    Role,
    Saga,
    StepContext,
    command,
)

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


APPROVAL_LIMIT_CENTS: Final = 15_000
"""Orders above this total wait for a manager's approval (:data:`large_order`)."""
MANAGERS: Final = Role("managers")
SENIOR_MANAGERS: Final = Role("senior-managers")
"""Who an approval goes to when the managers let it run past its due time."""
APPROVAL_DUE: Final = timedelta(hours=4)


class Approval(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A manager's answer to a large order."""

    approved: bool
    note: str = ""


large_order = Saga("large_order", version=1, context=ORDERS, data=Order)
approve = large_order.human_task(
    "approve",
    title=lambda o: f"Approve order {o.id} of {o.total_cents / 100:.2f} for {o.customer}",
    form=Approval,
    assignee=MANAGERS,
    due=APPROVAL_DUE,
    escalation=Escalation(reassign_to=SENIOR_MANAGERS, extend=APPROVAL_DUE),  # then it fails
)


@large_order.action()
async def approved(_order: Order, ctx: StepContext) -> str:
    """Go on only with the manager's yes (a no ends the order: nothing was done yet)."""
    answer = ctx.output(approve)
    if not answer.approved:
        raise PermanentError(f"not approved: {answer.note or 'no reason given'}")
    return answer.note


fulfil = large_order.child("fulfil", saga=order_fulfilment, data=lambda o: o)
"""An approved order is fulfilled as every other one is: order_fulfilment, as a child saga."""


def saga_for(order: Order) -> Saga[Order]:
    """The saga an order runs: :data:`large_order` above the approval limit, else order_fulfilment."""
    return large_order if order.total_cents > APPROVAL_LIMIT_CENTS else order_fulfilment


app = App("orders", sagas=[order_fulfilment, large_order])
