"""The seams of the trust boundary, on a real ``redis-server`` with every process its own ACL
user and keyring: what an attacker holding one principal's stolen credentials tries with
entries that were once genuine (replayed into another incarnation, fired early), with another
context's orchestrator, and with nothing signed at all. Each is refused: by Redis
(``NOPERM``), by the orchestrator (dead-lettered with its reason), or it changes nothing.
"""

from __future__ import annotations

import pytest

from bus import Envelope
from bus._envelope import decode_fields
from redsaga.examples.contracts import Order
from redsaga.examples.orders import order_fulfilment
from saga import SagaStatus
from saga.core.states import StepStatus
from tests.security.test_attacks import ORDER, ORDERS, World, world

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
__all__ = ["world"]  # the fixture, shared with test_attacks


def _envelope(fields: dict[bytes, bytes]) -> Envelope:
    return decode_fields(fields, max_bytes=1 << 20, max_fields=16)


async def _expire(world: World, saga_id: str) -> None:
    """What the saga's retention does when it ends: its keys go (the admin plays the TTL)."""
    admin = world.users.admin
    for key in (ORDERS.saga(saga_id), ORDERS.history(saga_id), ORDERS.branches(saga_id)):
        await admin.delete(key)


async def test_a_reply_replayed_into_a_later_incarnation_completes_nothing(world: World) -> None:
    await world.settle()  # the first incarnation ends
    operator = world.users.client("redsaga.operator")  # it may read the inbox
    [reply] = [
        fields
        for _, fields in await operator.xrange(ORDERS.inbox.key)
        if _envelope(fields).type == "StockReserved"
    ]
    await _expire(world, ORDER.id)
    again = Order(id=ORDER.id, customer="c2", lines=ORDER.lines, total_cents=ORDER.total_cents + 1)
    await world.client.start(order_fulfilment, again, saga_id=ORDER.id)
    await world.step("redsaga.orders")  # reserve_stock waits for inventory, again
    assert (await world.state()).steps["reserve_stock"].status == StepStatus.DISPATCHED
    await world.redis.xadd(ORDERS.inbox.key, reply)  # type: ignore[arg-type] - the stolen user adds it
    await world.step("redsaga.orders")
    assert (await world.state()).steps["reserve_stock"].status == StepStatus.DISPATCHED
    [reason] = await world.reasons()
    assert "answers its incarnation created at" in reason
    assert "a replay" in reason
    await world.settle()  # inventory's own reply to this incarnation still moves it
    assert (await world.state()).status == SagaStatus.COMPLETED
