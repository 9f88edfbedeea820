"""Every example service in one app (the demo and single-process deployments)."""

from __future__ import annotations

from saga import App
from services_example.inventory import inventory, stock
from services_example.orders import order_fulfilment
from services_example.payments import ledger, payments
from services_example.shipping import shipping

app = App(
    "demo",
    sagas=[order_fulfilment],
    participants=[payments, inventory, shipping],
    on_start=[ledger.open, stock.open],
    on_stop=[ledger.close, stock.close],
)
