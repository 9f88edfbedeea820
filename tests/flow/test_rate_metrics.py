"""The rate limits' metrics: per limit, never per saga."""

from __future__ import annotations

import pytest

import bus
from bus import FakeClock
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import app as stateless
from saga import App, EngineConfig, RateLimit, SagaClient, SagaWorker
from saga.metrics import METRICS, WorkerMetrics
from tests.metrics.scrape import parse, value

pytestmark = pytest.mark.anyio
CONFIG = EngineConfig(auth=bus.SIGNING_OFF)
LIMIT = "order_fulfilment.charge_payment"


async def test_sent_delayed_returned_and_the_bucket_are_exported_per_limit(real_redis: bus.Redis) -> None:
    app = App(
        "limited",
        sagas=[order_fulfilment],
        participants=stateless.participants,
        limits=[RateLimit(LIMIT, "1/s")],
    )
    clock = FakeClock()
    worker = SagaWorker(real_redis, app, config=CONFIG, clock=clock)
    metrics = WorkerMetrics(worker)
    client = SagaClient(real_redis, app.registry, config=CONFIG, clock=clock)
    for n in range(3):
        order = Order(id=f"o{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=1)
        await client.start(order_fulfilment, order, saga_id=order.id)
    await worker.run_until_idle()
    await client.cancel("o2", reason="test")
    await worker.run_until_idle()
    samples = parse((await metrics.exposition()).decode())
    assert value(samples, "redsaga_rate_limited_commands_total", limit=LIMIT, outcome="sent") == 1
    assert value(samples, "redsaga_rate_limited_commands_total", limit=LIMIT, outcome="delayed") == 2
    assert value(samples, "redsaga_rate_limit_delay_seconds_total", limit=LIMIT) == 3.0  # 1 s and 2 s
    assert value(samples, "redsaga_rate_limit_tokens_returned_total", limit=LIMIT) == 1
    assert value(samples, "redsaga_rate_limit_rate", limit=LIMIT) == 1.0
    assert value(samples, "redsaga_rate_limit_tokens", limit=LIMIT) <= 1
    exported = {name for name, _ in samples}
    assert exported <= {sample for spec in METRICS for sample in spec.samples}
    labelled = [labels for name, labels in samples if name.startswith("redsaga_rate_limit")]
    assert all(set(dict(labels)) <= {"limit", "outcome"} for labels in labelled)  # no saga id


async def test_a_worker_without_limits_exports_no_rate_metrics(fake_redis: bus.Redis) -> None:
    samples = parse(
        (await WorkerMetrics(SagaWorker(fake_redis, stateless, config=CONFIG)).exposition()).decode()
    )
    assert not [name for name, _ in samples if name.startswith("redsaga_rate_limit")]
