"""The payments service: charges and refunds cards, with its ledger in its own database.

Each handler records the command in the relay's inbox, writes the ledger row and puts its
reply in the outbox, in one transaction; the relay publishes the reply after the commit.
A retried or redelivered command charges nothing and re-sends the first reply.
"""

from __future__ import annotations

import os

from bus import PermanentError, derived_id
from redsaga.examples._db import Database
from redsaga.examples._flaky import Flakiness
from redsaga.examples.contracts import ORDERS, CardCharged, CardRefunded, ChargeCard, RefundCard
from saga import App, CommandContext, Participant

SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    entry_id  TEXT PRIMARY KEY,
    order_id  TEXT NOT NULL,
    amount    INTEGER NOT NULL
)
"""

payments = Participant("payments", serves=[ORDERS])
ledger = Database(
    os.environ.get("PAYMENTS_DSN") or os.environ.get("REDSAGA_PG_DSN") or "sqlite:///payments.db", SCHEMA
)
"""``$PAYMENTS_DSN``, else ``$REDSAGA_PG_DSN``, else ``payments.db`` here (the demo points it elsewhere)."""
_flaky = Flakiness()


class CardDeclined(PermanentError):
    """The card was declined: retrying will not help."""


@payments.handles(ChargeCard, outbox=True)
async def charge(command: ChargeCard, ctx: CommandContext) -> None:
    """Charge the card; a declined card fails the step for good."""
    _flaky.check(ctx.idempotency_key, command.flaky, "payment gateway")
    if command.card == "declined":
        raise CardDeclined(f"card of {command.customer} declined")
    async with ledger.transaction() as tx:
        received = await tx.receive("payments", ctx.envelope)
        if received.duplicate:
            await tx.resend(received)
            return
        charge_id = derived_id(ctx.idempotency_key, "charge")
        await tx.execute(
            "INSERT INTO ledger (entry_id, order_id, amount) VALUES (?, ?, ?)",
            (charge_id, command.order_id, command.amount_cents),
        )
        await tx.reply(received, CardCharged(charge_id=charge_id, amount_cents=command.amount_cents))


@payments.handles(RefundCard, outbox=True)
async def refund(command: RefundCard, ctx: CommandContext) -> None:
    """Refund a charge (a negative ledger entry)."""
    async with ledger.transaction() as tx:
        received = await tx.receive("payments", ctx.envelope)
        if received.duplicate:
            await tx.resend(received)
            return
        refund_id = derived_id(ctx.idempotency_key, "refund")
        rows = await tx.execute("SELECT order_id FROM ledger WHERE entry_id = ?", (command.charge_id,))
        order_id = rows[0][0] if rows else ""
        await tx.execute(
            "INSERT INTO ledger (entry_id, order_id, amount) VALUES (?, ?, ?)",
            (refund_id, order_id, -command.amount_cents),
        )
        await tx.reply(received, CardRefunded(refund_id=refund_id))


async def balances() -> dict[str, int]:
    """Net amount charged per order."""
    async with ledger.transaction() as tx:
        rows = await tx.execute("SELECT order_id, SUM(amount) FROM ledger GROUP BY order_id")
    return {order: int(total) for order, total in rows}


app = App("payments", participants=[payments], on_start=[ledger.open], on_stop=[ledger.close])
