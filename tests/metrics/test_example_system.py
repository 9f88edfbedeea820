"""Scrape /metrics from workers running the example system on real Redis, and check the values
against what happened.

Two workers, as compose.yaml runs them: the orders orchestrator, and the payments, inventory
and shipping participants (their databases SQLite files here, each with its relay), each
serving its own metrics port. Orders are drawn to fail the ways the demo's do: declined cards
and unserved regions (compensated) and flaky services (redelivered by the bus); a malformed
entry is dead-lettered; then, with the participants stopped and a crashed consumer holding
one command, new sagas pile up as pending and lag.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

import bus
import relay
from bus._auth import KEYRING_ENV, encode_keyrings, load_keyrings
from redsaga.examples import inventory as inventory_service
from redsaga.examples import payments as payments_service
from redsaga.examples.all import app as every_service
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import app as orders_app
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.shipping import shipping
from relay import Relay, RelayConfig
from saga import App, EngineConfig, SagaClient, SagaNotFound, SagaStatus, SagaWorker
from saga.metrics import WorkerMetrics
from saga.ops.keyrings import issue_keyrings, new_master, reach_of
from tests.helpers import eventually
from tests.metrics.scrape import get, scrape, value

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

FAST = bus.BusConfig(block_ms=100, reclaim_interval_ms=50, retry_base_ms=20, retry_max_ms=100)
MASTER = new_master()
REACH = reach_of(every_service, clients=["metrics-test"])


def keys_of(*principals: str) -> str:
    """These principals' keyrings, as a keyring file's JSON."""
    return encode_keyrings(issue_keyrings(MASTER, REACH, principals)).decode()


def signing_as(*principals: str) -> EngineConfig:
    """Every entry signed and checked, as in production: these principals' keyrings."""
    return EngineConfig(bus=FAST, auth=bus.Authenticator(load_keyrings(keys_of(*principals))))


PARTICIPANT_PRINCIPALS = ("participant:inventory", "participant:payments", "participant:shipping")

PARTICIPANTS = App(
    "participants",
    participants=[payments_service.payments, inventory_service.inventory, shipping],
    on_start=[payments_service.ledger.open, inventory_service.stock.open],
    on_stop=[payments_service.ledger.close, inventory_service.stock.close],
)
SAGA = {"context": "orders", "definition": "order_fulfilment"}
CMD_INVENTORY = "rs:{orders:0}:cmd:inventory"


def order(order_id: str, *, card: str = "ok", region: str = "eu", flaky: int = 0) -> Order:
    return Order(
        id=order_id,
        customer="c",
        lines=[Line(sku="s", quantity=1)],
        total_cents=1000,
        card=card,
        region=region,
        flaky=flaky,
    )


@asynccontextmanager
async def serving(worker: SagaWorker, tg: anyio.abc.TaskGroup) -> AsyncIterator[tuple[WorkerMetrics, int]]:
    """The worker's metrics on a free loopback port, open before the worker runs."""
    metrics = WorkerMetrics(worker, stuck_for_ms=1)
    port = await tg.start(metrics.server().serve)
    yield metrics, port


async def test_the_metrics_of_the_example_system_match_what_happened(
    real_redis: bus.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the participants sign the replies they put in their outboxes with the process's keyring
    monkeypatch.setenv(KEYRING_ENV, keys_of(*PARTICIPANT_PRINCIPALS))
    payments_service.ledger.dsn = f"sqlite:///{tmp_path / 'payments.db'}"
    inventory_service.stock.dsn = f"sqlite:///{tmp_path / 'inventory.db'}"
    # as compose's orders keyring file holds: the task inbox of its large orders runs there too
    orders = SagaWorker(real_redis, orders_app, config=signing_as("orchestrator:orders", "participant:tasks"))
    participants = SagaWorker(
        real_redis,
        PARTICIPANTS,
        config=signing_as(*PARTICIPANT_PRINCIPALS),
    )
    # a signed client sends start requests, which the orchestrator decides (and counts)
    client = SagaClient(
        real_redis, orders_app.registry, config=signing_as("client:metrics-test"), source="metrics-test"
    )
    dsns = (payments_service.ledger.dsn, inventory_service.stock.dsn)
    for dsn in dsns:
        await relay.init_db(dsn)
    relays = [Relay.connect(dsn, real_redis, config=RelayConfig(poll_interval_s=0.02)) for dsn in dsns]
    batch = [
        order("ok-1"),
        order("ok-2"),
        # each participant fails it twice, then the bus redelivers it; the id is this module's own: the
        # demo counts attempts per idempotency key in the process, and other tests run sagas "flaky"
        order("flaky-metrics", flaky=2),
        order("declined", card="declined"),  # charge fails for good: release the stock
        order("nowhere", region="nowhere"),  # shipping fails for good: refund, then release
    ]
    async with anyio.create_task_group() as tg:
        async with serving(orders, tg) as (_, orders_port), serving(participants, tg) as (_, p_port):
            status, text = await get(orders_port, "/readyz")
            assert (status, text) == (503, "the worker is not reading its streams yet\n")
            assert await get(orders_port, "/healthz") == (200, "ok\n")
            tg.start_soon(orders.run)
            for one in relays:
                tg.start_soon(one.run)
            await orders.started.wait()
            await phase_one(
                orders_port=orders_port,
                p_port=p_port,
                participants=participants,
                client=client,
                batch=batch,
                real_redis=real_redis,
            )
            # Participants stopped; a crashed consumer took one command and never acknowledged it.
            for n in range(3):
                await client.start(order_fulfilment, order(f"later-{n}"), saga_id=f"later-{n}")

            cmd = {"stream": "orders/cmd:inventory", "partition": "0", "group": "inventory"}

            async def lag_is_three() -> bool:
                return value(await scrape(p_port), "redsaga_stream_lag", **cmd) == 3

            await eventually(lag_is_three, 30, "the three new commands wait on inventory's stream")
            await real_redis.xreadgroup("inventory", "crashed", {CMD_INVENTORY: ">"}, count=1)
            theirs = await scrape(p_port)
            assert value(theirs, "redsaga_stream_pending", **cmd) == 1
            assert value(theirs, "redsaga_stream_lag", **cmd) == 2

            async def three_stuck() -> bool:
                return value(await scrape(orders_port), "redsaga_sagas_stuck", context="orders") == 3

            await eventually(three_stuck, 30, "the three new sagas count as stuck (threshold 1 ms)")
            seen = await scrape(orders_port)
            assert value(seen, "redsaga_sagas_in_flight", **SAGA, version="1", status="running") == 3
            assert value(seen, "redsaga_timers_due", context="orders") == 0  # their timeouts are 30 s away
            orders.stop()
            for one in relays:
                one.stop()
            tg.cancel_scope.cancel()


async def phase_one(
    *,
    orders_port: int,
    p_port: int,
    participants: SagaWorker,
    client: SagaClient,
    batch: list[Order],
    real_redis: bus.Redis,
) -> None:
    """Run the batch and the malformed entry to their ends with the participants running."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(participants.run)
        await participants.started.wait()
        assert await get(orders_port, "/readyz") == (200, "ready\n")
        assert await get(p_port, "/readyz") == (200, "ready\n")

        for item in batch:
            await client.start(order_fulfilment, item, saga_id=item.id)
        # a malformed entry on shipping's stream: dead-lettered on its first delivery
        await real_redis.xadd("rs:{orders:0}:cmd:shipping", {"junk": "1"})

        async def all_ended() -> bool:
            try:  # a start request is decided by the orchestrator: until then there is no saga
                states = [await client.get(item.id) for item in batch]
            except SagaNotFound:
                return False
            return all(s.status.terminal for s in states)

        await eventually(all_ended, 60, "every saga ended")
        assert {item.id: (await client.get(item.id)).status for item in batch} == {
            "ok-1": SagaStatus.COMPLETED,
            "ok-2": SagaStatus.COMPLETED,
            "flaky-metrics": SagaStatus.COMPLETED,
            "declined": SagaStatus.COMPENSATED,
            "nowhere": SagaStatus.COMPENSATED,
        }

        async def one_letter() -> bool:
            return int(await real_redis.xlen("rs:{orders:0}:dlq")) == 1

        await eventually(one_letter, 30, "the malformed entry was dead-lettered")
        letters = 1

        seen = await scrape(orders_port)
        assert value(seen, "redsaga_sagas_started_total", **SAGA, version="1") == 5
        assert value(seen, "redsaga_sagas_ended_total", **SAGA, status="completed") == 3
        assert value(seen, "redsaga_sagas_ended_total", **SAGA, status="compensated") == 2
        assert value(seen, "redsaga_sagas_dead_lettered_total") == 0
        # end to end, start to end: one observation per saga, by how it ended
        assert value(seen, "redsaga_saga_duration_seconds_count", **SAGA, status="completed") == 3
        assert value(seen, "redsaga_saga_duration_seconds_count", **SAGA, status="compensated") == 2
        assert value(seen, "redsaga_saga_duration_seconds_sum", **SAGA, status="completed") > 0
        attempts = {
            (step, kind, outcome): value(
                seen, "redsaga_step_attempts_total", step=step, kind=kind, outcome=outcome
            )
            for step, kind, outcome in [
                ("reserve_stock", "do", "ok"),
                ("reserve_stock", "do", "transient"),
                ("charge_payment", "do", "ok"),
                ("charge_payment", "do", "transient"),
                ("charge_payment", "do", "permanent"),
                ("arrange_shipping", "do", "ok"),
                ("arrange_shipping", "do", "transient"),
                ("arrange_shipping", "do", "permanent"),
                ("reserve_stock", "undo", "ok"),
                ("charge_payment", "undo", "ok"),
            ]
        }
        assert attempts == {
            ("reserve_stock", "do", "ok"): 5,
            ("reserve_stock", "do", "transient"): 2,  # flaky: the saga retried it twice
            ("charge_payment", "do", "ok"): 4,
            ("charge_payment", "do", "transient"): 2,
            ("charge_payment", "do", "permanent"): 1,  # declined
            ("arrange_shipping", "do", "ok"): 3,
            ("arrange_shipping", "do", "transient"): 2,
            ("arrange_shipping", "do", "permanent"): 1,  # nowhere
            ("reserve_stock", "undo", "ok"): 2,  # both compensated sagas released their stock
            ("charge_payment", "undo", "ok"): 1,  # nowhere was refunded
        }
        assert value(seen, "redsaga_step_attempts_total") == sum(attempts.values())
        # every attempt that ended is in the duration histogram, under the same labels
        assert value(seen, "redsaga_step_duration_seconds_count") == sum(attempts.values())
        assert (
            value(seen, "redsaga_step_duration_seconds_count", step="charge_payment", kind="do", outcome="ok")
            == 4
        )
        assert value(seen, "redsaga_compensations_total", step="reserve_stock", outcome="compensated") == 2
        assert value(seen, "redsaga_compensations_total", step="charge_payment", outcome="compensated") == 1
        assert value(seen, "redsaga_sagas_in_flight") == 0
        assert value(seen, "redsaga_dead_letters", stream="orders/dlq", partition="0") == letters
        assert value(seen, "redsaga_redis_up") == 1
        # the orchestrator's inbox: every reply read once, all acknowledged
        inbox = {"stream": "orders/inbox", "partition": "0", "group": "orchestrator"}
        assert value(seen, "redsaga_stream_pending", **inbox) == 0
        assert value(seen, "redsaga_stream_lag", **inbox) == 0
        assert value(seen, "redsaga_deliveries_total", **inbox) == int(
            await real_redis.xlen("rs:{orders:0}:inbox")
        )

        async def all_acknowledged() -> bool:
            theirs = await scrape(p_port)
            return value(theirs, "redsaga_stream_pending") == 0

        await eventually(all_acknowledged, 30, "the participants acknowledged every command")
        theirs = await scrape(p_port)
        # each command stream delivered every attempt sent to it once, and no lease expired
        for name, sent in (
            ("inventory", 5 + 2 + 2),
            ("payments", 4 + 2 + 1 + 1),
            ("shipping", 3 + 2 + 1 + 1),
        ):
            cmd = {"stream": f"orders/cmd:{name}", "partition": "0", "group": name}
            assert value(theirs, "redsaga_deliveries_total", **cmd) == sent, name  # shipping: + the junk
            assert value(theirs, "redsaga_redeliveries_total", **cmd) == 0, name
            # each read timed from when the orchestrator's transition added it (schedule to start)
            assert value(theirs, "redsaga_queue_wait_seconds_count", **cmd) == sent, name
        assert value(seen, "redsaga_timer_lag_seconds_count") == 6  # the six retries' back-off timers
        assert value(theirs, "redsaga_dead_letters") == 0  # a participant may not read them
        assert value(theirs, "redsaga_sagas_started_total") == 0  # it orchestrates nothing
        assert value(theirs, "redsaga_build_info") == value(seen, "redsaga_build_info") == 1

        participants.stop()  # leaving the group waits until it stopped reading
