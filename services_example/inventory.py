"""The inventory service: reserves and releases stock (in memory, for the demo)."""

from __future__ import annotations

from bus import derived_id
from saga import App, CommandContext, Participant
from services_example._flaky import Flakiness
from services_example.contracts import ORDERS, ReleaseStock, ReserveStock, StockReleased, StockReserved

inventory = Participant("inventory", serves=[ORDERS])
reservations: dict[str, ReserveStock] = {}
_flaky = Flakiness()


@inventory.handles(ReserveStock)
async def reserve(command: ReserveStock, ctx: CommandContext) -> StockReserved:
    """Reserve the lines; the reservation id derives from the idempotency key."""
    _flaky.check(ctx.idempotency_key, command.flaky, "inventory")
    reservation_id = derived_id(ctx.idempotency_key, "reservation")
    reservations[reservation_id] = command
    return StockReserved(reservation_id=reservation_id)


@inventory.handles(ReleaseStock)
async def release(command: ReleaseStock, _ctx: CommandContext) -> StockReleased:
    """Release a reservation (releasing twice is harmless)."""
    reservations.pop(command.reservation_id, None)
    return StockReleased(reservation_id=command.reservation_id)


app = App("inventory", participants=[inventory])
