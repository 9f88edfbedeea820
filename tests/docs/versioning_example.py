"""docs/versioning.md's counter-example: the fraud check inserted into version 1 in place."""

from __future__ import annotations

from redsaga.examples.contracts import ORDERS, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.orders_v2 import order_fulfilment_v2
from saga import App, Saga

edited_in_place = Saga("order_fulfilment", version=1, context=ORDERS, data=Order)
for step in order_fulfilment_v2.steps:  # v2's steps, fraud check included, under version 1
    if step.local:
        edited_in_place.action(name=step.name)(step.function)
    else:
        assert step.output_type is not None
        edited_in_place.step(reply=step.output_type, compensate=step.compensate, name=step.name)(
            step.function
        )
for compensation in order_fulfilment.compensations.values():
    edited_in_place.compensation(compensation.name)(compensation.function)

app = App("orders", sagas=[edited_in_place])
