"""The metrics API for services that embed a worker, readiness, and the metrics port's HTTP."""

from __future__ import annotations

import contextlib

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import bus
import bus._http
from bus._metrics import stream_labels
from bus.metrics import MetricsServer
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import app
from saga import EngineConfig, SagaClient, SagaWorker
from saga.metrics import METRICS, WorkerMetrics
from tests.metrics.scrape import parse, value

pytestmark = pytest.mark.anyio
CONFIG = EngineConfig(auth=bus.SIGNING_OFF)


async def test_a_host_registry_scraped_from_another_thread_reads_redis_on_the_workers_loop(
    fake_redis: bus.Redis,
) -> None:
    worker = SagaWorker(fake_redis, app, config=CONFIG)
    registry = CollectorRegistry()  # a service's own, which it already serves on /metrics
    WorkerMetrics(worker, registry=registry)
    client = SagaClient(fake_redis, app.registry, config=CONFIG)
    for n, card in enumerate(["ok", "declined"]):
        order = Order(id=f"o{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=1, card=card)
        await client.start(order_fulfilment, order, saga_id=order.id)
    await worker.run_until_idle()
    # prometheus_client's own HTTP server renders the registry on a thread of its own
    samples = parse((await anyio.to_thread.run_sync(generate_latest, registry)).decode())
    assert value(samples, "redsaga_redis_up") == 1
    assert value(samples, "redsaga_sagas_ended_total", status="completed") == 1
    assert value(samples, "redsaga_sagas_ended_total", status="compensated") == 1
    assert value(samples, "redsaga_sagas_in_flight") == 0
    assert value(samples, "redsaga_saga_duration_seconds_count", status="completed") == 1
    assert value(samples, "redsaga_saga_duration_seconds_count", status="compensated") == 1
    assert value(samples, "redsaga_step_attempts_total", step="charge_payment", outcome="permanent") == 1
    inbox = {"stream": "orders/inbox", "partition": "0", "group": "orchestrator"}
    assert value(samples, "redsaga_stream_pending", **inbox) == 0
    # every entry read was timed from when Redis added it to the read
    delivered = value(samples, "redsaga_deliveries_total", **inbox)
    assert delivered > 0
    assert value(samples, "redsaga_queue_wait_seconds_count", **inbox) == delivered
    exported = {name for name, _ in samples}
    assert exported <= {sample for spec in METRICS for sample in spec.samples}


async def test_without_redis_the_process_figures_remain_and_redis_up_says_why() -> None:
    unreachable = bus.connect("redis://127.0.0.1:1/0", bus.ClientConfig(retries=0, connect_timeout_s=0.5))
    worker = SagaWorker(unreachable, app, config=CONFIG)
    metrics = WorkerMetrics(worker, timeout_s=2.0)
    samples = parse((await metrics.exposition()).decode())
    assert value(samples, "redsaga_redis_up") == 0
    assert value(samples, "redsaga_handler_slots", state="free") == bus.BusConfig().concurrency
    assert not [name for name, _ in samples if name in {"redsaga_stream_pending", "redsaga_sagas_in_flight"}]
    worker.bus_worker.started.set()  # as if it had been reading before Redis went away
    [problem] = await metrics.ready()
    assert problem.startswith("Redis does not answer")
    await unreachable.aclose()


async def test_readiness_names_a_missing_group_and_a_changed_epoch(fake_redis: bus.Redis) -> None:
    worker = SagaWorker(fake_redis, app, config=CONFIG)
    metrics = WorkerMetrics(worker)
    assert await metrics.ready() == ["the worker is not reading its streams yet"]
    await worker.bus_worker.setup()
    worker.bus_worker.started.set()
    assert await metrics.ready() == []
    await fake_redis.xgroup_destroy("rs:{orders:0}:cmd:shipping", "shipping")
    worker.bus_worker.epoch = "joined-earlier"
    assert await metrics.ready() == [
        "rs:epoch holds None, not the epoch 'joined-earlier' joined",
        "consumer group 'shipping' of rs:{orders:0}:cmd:shipping is missing",
    ]


async def raw(port: int, request: bytes) -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(request)
        answer = b""
        try:
            while True:
                answer += await stream.receive()
        except anyio.EndOfStream:
            return answer


async def test_the_metrics_port_answers_get_and_head_and_refuses_the_rest() -> None:
    async def ready() -> list[str]:
        return ["not yet", "really"]

    async def metrics() -> bytes:
        return b"redsaga_redis_up 1.0\n"

    async with anyio.create_task_group() as tg:
        port = await tg.start(MetricsServer(metrics, ready).serve)
        got = await raw(port, b"GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4")
        assert got.endswith(b"\r\n\r\nredsaga_redis_up 1.0\n")
        ready_answer = await raw(port, b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert ready_answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        assert ready_answer.endswith(b"\r\n\r\nnot yet\nreally\n")
        head = await raw(port, b"HEAD /healthz HTTP/1.0\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK")
        assert b"Content-Length: 3\r\n" in head
        assert head.endswith(b"Connection: close\r\n\r\n")  # the length of a body not sent
        assert (await raw(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
        assert (await raw(port, b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.1 404 ")
        assert (await raw(port, b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400 ")  # no Host
        assert (await raw(port, b"\x16\x03\x01 nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        assert (await raw(port, b"GET /" + b"a" * 20_000)).startswith(b"HTTP/1.1 431 ")
        tg.cancel_scope.cancel()


async def test_the_metrics_port_drops_a_request_head_that_never_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that sends a head byte by byte and never finishes it is answered 408 and closed."""
    monkeypatch.setattr(bus._http, "HEAD_TIMEOUT_S", 0.2)

    async def nothing() -> bytes:
        return b""

    async def ready() -> list[str]:
        return []

    async with anyio.create_task_group() as tg:
        port = await tg.start(MetricsServer(nothing, ready).serve)
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: never ends
            answer = b""
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    answer += await stream.receive()
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("key", "labels"),
    [
        ("rs:{orders:0}:inbox", ("orders/inbox", "0")),
        ("rs:{orders:12}:cmd:payments", ("orders/cmd:payments", "12")),
        ("rs:{orders:3}:dlq", ("orders/dlq", "3")),
        ("rs:{payments.events}:stream", ("payments.events", "")),
    ],
)
def test_a_stream_is_labelled_by_its_name_and_partition_never_its_key(
    key: str, labels: tuple[str, str]
) -> None:
    assert stream_labels(key) == labels
