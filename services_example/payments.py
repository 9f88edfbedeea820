"""The payments service: charges and refunds cards (an in-memory ledger for the demo)."""

from __future__ import annotations

from bus import PermanentError, derived_id
from saga import App, CommandContext, Participant
from services_example._flaky import Flakiness
from services_example.contracts import ORDERS, CardCharged, CardRefunded, ChargeCard, RefundCard

payments = Participant("payments", serves=[ORDERS])
ledger: dict[str, int] = {}
_flaky = Flakiness()


class CardDeclined(PermanentError):
    """The card was declined: retrying will not help."""


@payments.handles(ChargeCard)
async def charge(command: ChargeCard, ctx: CommandContext) -> CardCharged:
    """Charge the card; a declined card fails the step for good."""
    _flaky.check(ctx.idempotency_key, command.flaky, "payment gateway")
    if command.card == "declined":
        raise CardDeclined(f"card of {command.customer} declined")
    charge_id = derived_id(ctx.idempotency_key, "charge")
    ledger[charge_id] = command.amount_cents
    return CardCharged(charge_id=charge_id, amount_cents=command.amount_cents)


@payments.handles(RefundCard)
async def refund(command: RefundCard, ctx: CommandContext) -> CardRefunded:
    """Refund a charge."""
    ledger[command.charge_id] = ledger.get(command.charge_id, 0) - command.amount_cents
    return CardRefunded(refund_id=derived_id(ctx.idempotency_key, "refund"))


app = App("payments", participants=[payments])
