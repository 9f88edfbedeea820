"""A participant that keeps its state in a database and replies through the outbox."""

from __future__ import annotations

from pathlib import Path

import pytest

import bus
from redsaga.examples import payments as payments_service
from redsaga.examples.all import app
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from relay import Relay
from saga import SagaClient, SagaStatus, SagaWorker
from tests.helpers import envelope_items

pytestmark = pytest.mark.anyio


async def test_a_redelivered_charge_charges_once_and_resends_the_first_reply(
    redis: bus.Redis, tmp_path: Path
) -> None:
    payments_service.ledger.dsn = f"sqlite:///{tmp_path / 'payments.db'}"
    from redsaga.examples import inventory as inventory_service

    inventory_service.stock.dsn = f"sqlite:///{tmp_path / 'inventory.db'}"
    for hook in app.on_start:
        await hook()
    try:
        worker = SagaWorker(redis, app)
        client = SagaClient(redis, app.registry)
        order = Order(id="o1", customer="c", lines=[Line(sku="s", quantity=2)], total_cents=700)
        await client.start(order_fulfilment, order, saga_id="o1")
        relays = [
            Relay.connect(dsn, redis) for dsn in (payments_service.ledger.dsn, inventory_service.stock.dsn)
        ]

        async def settle() -> None:
            for _ in range(10):
                await worker.run_until_idle()
                for one in relays:
                    await one.run(drain=True)
            await worker.run_until_idle()

        await settle()
        assert (await client.get("o1")).status == SagaStatus.COMPLETED
        assert await payments_service.balances() == {"o1": 700}

        # the same charge command arrives again (an operator re-queued it from a backup, say)
        stream = bus.Stream("orders:0", "cmd:payments")
        replies_before = await redis.xlen("rs:{orders:0}:inbox")
        [(_, fields)] = [
            e for e in await redis.xrange(stream.key) if envelope_items(e[1])["type"] == "ChargeCard"
        ]
        await redis.xadd(stream.key, fields)
        await settle()
        assert await payments_service.balances() == {"o1": 700}  # charged once
        # the inbox re-sent the first reply; its id is the first reply's, so the relay's
        # publish dedupe kept it out of the stream
        assert await redis.xlen("rs:{orders:0}:inbox") == replies_before
        assert (await client.get("o1")).status == SagaStatus.COMPLETED
    finally:
        for hook in app.on_stop:
            await hook()
