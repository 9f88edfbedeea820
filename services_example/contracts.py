"""The messages the example services exchange (what a shared contracts package would hold)."""

from __future__ import annotations

import msgspec

from saga import Context

ORDERS = Context("orders", partitions=1)


class Line(msgspec.Struct, frozen=True):
    """One order line."""

    sku: str
    quantity: int


class Order(msgspec.Struct, frozen=True, kw_only=True):
    """The data an order-fulfilment saga starts with.

    ``card`` and ``region`` drive the demo's injected failures: card ``"declined"`` fails
    the payment for good, region ``"nowhere"`` has no carrier, and ``flaky`` makes each
    participant fail transiently that many times before it succeeds.
    """

    id: str
    customer: str
    lines: list[Line]
    total_cents: int
    card: str = "ok"
    region: str = "eu"
    flaky: int = 0


class ReserveStock(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Inventory: reserve the order's lines."""

    order_id: str
    lines: list[Line]
    flaky: int = 0


class StockReserved(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Inventory's reply: the reservation to release if the order fails later."""

    reservation_id: str


class ReleaseStock(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Inventory: undo a reservation."""

    reservation_id: str


class StockReleased(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Inventory's reply to a release."""

    reservation_id: str


class ChargeCard(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Payments: charge the customer's card."""

    order_id: str
    customer: str
    amount_cents: int
    card: str
    flaky: int = 0


class CardCharged(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Payments' reply: the charge to refund if the order fails later."""

    charge_id: str
    amount_cents: int


class RefundCard(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Payments: refund a charge."""

    charge_id: str
    amount_cents: int


class CardRefunded(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Payments' reply to a refund."""

    refund_id: str


class ArrangeShipping(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Shipping: book a carrier for the order."""

    order_id: str
    region: str
    flaky: int = 0


class ShipmentArranged(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Shipping's reply: the tracking number."""

    tracking: str
