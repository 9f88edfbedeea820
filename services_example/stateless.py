"""The example saga with stateless participants (no databases, no relays).

What the engine tests and the benchmarks run: the same saga and messages as the demo, with
participants whose only state is the bus's idempotency record.
"""

from __future__ import annotations

from bus import PermanentError, derived_id
from redsaga.examples.contracts import (
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
from redsaga.examples.orders import order_fulfilment
from saga import App, CommandContext, Participant

inventory = Participant("inventory", serves=[ORDERS])
payments = Participant("payments", serves=[ORDERS])
shipping = Participant("shipping", serves=[ORDERS])


@inventory.handles(ReserveStock)
async def reserve(_command: ReserveStock, ctx: CommandContext) -> StockReserved:
    """Reserve (nothing to store: the reservation id derives from the idempotency key)."""
    return StockReserved(reservation_id=derived_id(ctx.idempotency_key, "r"))


@inventory.handles(ReleaseStock)
async def release(command: ReleaseStock, _ctx: CommandContext) -> StockReleased:
    """Release a reservation."""
    return StockReleased(reservation_id=command.reservation_id)


@payments.handles(ChargeCard)
async def charge(command: ChargeCard, ctx: CommandContext) -> CardCharged:
    """Charge, unless the card is ``declined``."""
    if command.card == "declined":
        raise PermanentError("card declined")
    return CardCharged(charge_id=derived_id(ctx.idempotency_key, "c"), amount_cents=command.amount_cents)


@payments.handles(RefundCard)
async def refund(_command: RefundCard, ctx: CommandContext) -> CardRefunded:
    """Refund a charge."""
    return CardRefunded(refund_id=derived_id(ctx.idempotency_key, "f"))


@shipping.handles(ArrangeShipping)
async def arrange(command: ArrangeShipping, _ctx: CommandContext) -> ShipmentArranged:
    """Book a carrier, unless the region is ``nowhere``."""
    if command.region == "nowhere":
        raise PermanentError("no carrier")
    return ShipmentArranged(tracking="t")


app = App("memory", sagas=[order_fulfilment], participants=[inventory, payments, shipping])
