"""The example saga with in-memory participants: engine tests without databases or relays."""

from __future__ import annotations

from bus import PermanentError, derived_id
from saga import App, CommandContext, Participant
from services_example.contracts import (
    ORDERS,
    ArrangeShipping,
    CardCharged,
    CardRefunded,
    ChargeCard,
    RefundCard,
    ReleaseStock,
    ReserveStock,
    ShipmentArranged,
    StockReleased,
    StockReserved,
)
from services_example.orders import order_fulfilment

inventory = Participant("inventory", serves=[ORDERS])
payments = Participant("payments", serves=[ORDERS])
shipping = Participant("shipping", serves=[ORDERS])


@inventory.handles(ReserveStock)
async def reserve(command: ReserveStock, ctx: CommandContext) -> StockReserved:
    return StockReserved(reservation_id=derived_id(ctx.idempotency_key, "r"))


@inventory.handles(ReleaseStock)
async def release(command: ReleaseStock, ctx: CommandContext) -> StockReleased:
    return StockReleased(reservation_id=command.reservation_id)


@payments.handles(ChargeCard)
async def charge(command: ChargeCard, ctx: CommandContext) -> CardCharged:
    if command.card == "declined":
        raise PermanentError("card declined")
    return CardCharged(charge_id=derived_id(ctx.idempotency_key, "c"), amount_cents=command.amount_cents)


@payments.handles(RefundCard)
async def refund(command: RefundCard, ctx: CommandContext) -> CardRefunded:
    return CardRefunded(refund_id=derived_id(ctx.idempotency_key, "f"))


@shipping.handles(ArrangeShipping)
async def arrange(command: ArrangeShipping, ctx: CommandContext) -> ShipmentArranged:
    if command.region == "nowhere":
        raise PermanentError("no carrier")
    return ShipmentArranged(tracking="t")


app = App("memory", sagas=[order_fulfilment], participants=[inventory, payments, shipping])
