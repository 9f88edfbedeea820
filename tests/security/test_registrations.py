"""A participant's registration (which worker runs it, read by ``saga stats`` and the task
client to find the command streams) is written by that participant's own ACL user alone, on
a real ``redis-server``: another participant's user cannot overwrite it."""

from __future__ import annotations

import pytest
from redis import exceptions as rx

from saga.store.keys import ContextKeys
from saga.versions.registry import Versions
from tests.faults.servers import PrivateRedis
from tests.security.acl_users import applied
from tests.security.signed_world import ORDERS

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
KEYS = ContextKeys("orders")


async def test_a_participant_cannot_overwrite_another_participants_registration(
    private_redis_server: PrivateRedis,
) -> None:
    async with applied(private_redis_server, ORDERS) as users:
        inventory = users.client("redsaga.orders.inventory")
        await Versions(inventory).register_participant("orders", "inventory", by="inventory-worker-1")
        payments = users.client("redsaga.orders.payments")
        await Versions(payments).register_participant("orders", "payments", by="payments-worker-1")
        assert await users.denials() == []  # each registers itself within its grants

        forged = b'{"by":"payments-worker-1","at_ms":1}'
        attempts = [
            lambda: payments.hset(KEYS.participants, "inventory", forged),  # the one hash it was
            lambda: payments.set(KEYS.participant("inventory"), forged),
            lambda: payments.delete(KEYS.participant("inventory")),
            lambda: payments.set(KEYS.participants, forged),  # the set of names, as a string
        ]
        for attempt in attempts:
            with pytest.raises(rx.NoPermissionError):
                await attempt()
        await payments.sadd(KEYS.participants, "ghost")  # it may add a name: one without a record
        records = await Versions(users.admin).participant_records("orders")
        assert {n: r.by for n, r in records.items()} == {
            "inventory": "inventory-worker-1",
            "payments": "payments-worker-1",
        }
        assert await Versions(users.client("redsaga.operator")).participants("orders") == [
            "inventory",
            "payments",
        ]
