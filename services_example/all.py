"""Every example service in one app (the demo and single-process deployments)."""

from __future__ import annotations

from redsaga.examples.inventory import inventory, stock
from redsaga.examples.orders import large_order, order_fulfilment
from redsaga.examples.payments import ledger, payments
from redsaga.examples.shipping import shipping
from saga import App, RateLimit

app = App(
    "demo",
    sagas=[order_fulfilment, large_order],
    participants=[payments, inventory, shipping],
    on_start=[ledger.open, stock.open],
    on_stop=[ledger.close, stock.close],
    limits=[RateLimit("payments", "100/s", burst=20)],  # what the card processor allows
)
