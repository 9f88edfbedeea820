"""The shipping service: books carriers."""

from __future__ import annotations

from bus import PermanentError, derived_id
from redsaga.examples._flaky import Flakiness
from redsaga.examples.contracts import ORDERS, ArrangeShipping, ShipmentArranged
from saga import App, CommandContext, Participant

shipping = Participant("shipping", serves=[ORDERS])
_flaky = Flakiness()


class NoCarrier(PermanentError):
    """No carrier serves the region."""


@shipping.handles(ArrangeShipping)
async def arrange(command: ArrangeShipping, ctx: CommandContext) -> ShipmentArranged:
    """Book a carrier; region ``nowhere`` has none."""
    _flaky.check(ctx.idempotency_key, command.flaky, "carrier API")
    if command.region == "nowhere":
        raise NoCarrier(f"no carrier ships to {command.region!r}")
    return ShipmentArranged(tracking=derived_id(ctx.idempotency_key, "tracking")[:13])


app = App("shipping", participants=[shipping])
