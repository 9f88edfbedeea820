"""The inventory service: reserves and releases stock, in its own database with an inbox."""

from __future__ import annotations

import os

from bus import derived_id
from redsaga.examples._db import Database
from redsaga.examples._flaky import Flakiness
from redsaga.examples.contracts import ORDERS, ReleaseStock, ReserveStock, StockReleased, StockReserved
from saga import App, CommandContext, Participant

SCHEMA = """
CREATE TABLE IF NOT EXISTS reservations (
    reservation_id  TEXT PRIMARY KEY,
    order_id        TEXT NOT NULL,
    sku             TEXT NOT NULL,
    quantity        INTEGER NOT NULL
)
"""

inventory = Participant("inventory", serves=[ORDERS])
stock = Database(
    os.environ.get("INVENTORY_DSN") or os.environ.get("REDSAGA_PG_DSN") or "sqlite:///inventory.db", SCHEMA
)
"""``$INVENTORY_DSN``, else ``$REDSAGA_PG_DSN``, else ``inventory.db`` here (the demo points it elsewhere)."""
_flaky = Flakiness()


@inventory.handles(ReserveStock, outbox=True)
async def reserve(command: ReserveStock, ctx: CommandContext) -> None:
    """Reserve the lines; the reservation id derives from the idempotency key."""
    _flaky.check(ctx.idempotency_key, command.flaky, "inventory")
    async with stock.transaction() as tx:
        received = await tx.receive("inventory", ctx.envelope)
        if received.duplicate:
            await tx.resend(received)
            return
        reservation_id = derived_id(ctx.idempotency_key, "reservation")
        for n, line in enumerate(command.lines):
            await tx.execute(
                "INSERT INTO reservations (reservation_id, order_id, sku, quantity) VALUES (?, ?, ?, ?)",
                (f"{reservation_id}:{n}", command.order_id, line.sku, line.quantity),
            )
        await tx.reply(received, StockReserved(reservation_id=reservation_id))


@inventory.handles(ReleaseStock, outbox=True)
async def release(command: ReleaseStock, ctx: CommandContext) -> None:
    """Release a reservation (releasing twice is harmless)."""
    async with stock.transaction() as tx:
        received = await tx.receive("inventory", ctx.envelope)
        if received.duplicate:
            await tx.resend(received)
            return
        await tx.execute(
            "DELETE FROM reservations WHERE reservation_id LIKE ?", (f"{command.reservation_id}:%",)
        )
        await tx.reply(received, StockReleased(reservation_id=command.reservation_id))


async def reserved_orders() -> set[str]:
    """Orders that hold reserved stock."""
    async with stock.transaction() as tx:
        rows = await tx.execute("SELECT DISTINCT order_id FROM reservations")
    return {order for (order,) in rows}


app = App("inventory", participants=[inventory], on_start=[stock.open], on_stop=[stock.close])
