"""OpenTelemetry tracing: one trace per saga across the orchestrator and its participants.

The SDK's in-memory exporter collects every span the workers make; the orchestrators and the
participants run as two workers (two services) on fakeredis and on a real Redis.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import bus
from bus import FakeClock
from bus.tracing import use_tracer_provider
from saga import EngineConfig, SagaClient, SagaStatus, SagaWorker
from saga.store.keys import Partition
from tests.tracing.traced_sagas import TRIPS, Trip, orchestrators, services

pytestmark = pytest.mark.anyio
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        use_tracer_provider(None)
        provider.shutdown()


class System:
    """The trips' orchestrators and their participants as two workers, and a client."""

    def __init__(self, redis: bus.Redis) -> None:
        self.clock = FakeClock()
        self.orchestrators = SagaWorker(redis, orchestrators, config=CONFIG, clock=self.clock)
        self.services = SagaWorker(redis, services, config=CONFIG, clock=self.clock)
        self.client = SagaClient(redis, orchestrators.registry, clock=self.clock)

    async def settle(self) -> None:
        for _ in range(50):
            await self.orchestrators.run_until_idle()
            await self.services.run_until_idle()

    async def run(self, data: Trip) -> SagaStatus:
        await self.client.start("trip", data, saga_id=data.id)
        await self.settle()
        self.clock.advance(3600)  # the nap's timer
        await self.settle()
        return (await self.client.get(data.id, context=TRIPS.name)).status


def by_name(found: list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    named: dict[str, list[ReadableSpan]] = {}
    for span in found:
        named.setdefault(span.name, []).append(span)
    return named


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_one_trace_spans_the_saga_its_timer_and_its_child(
    redis: bus.Redis, spans: InMemorySpanExporter
) -> None:
    system = System(redis)
    assert await system.run(Trip(id="t1")) == SagaStatus.COMPLETED
    found = list(spans.get_finished_spans())
    named = by_name(found)
    assert {span.context.trace_id for span in found} == {named["saga start trip"][0].context.trace_id}
    [start] = named["saga start trip"]
    assert start.kind == SpanKind.PRODUCER
    assert start.parent is None
    assert start.attributes is not None
    assert start.attributes["redsaga.saga.id"] == "t1"
    assert start.attributes["redsaga.definition"] == "trip"
    assert start.attributes["redsaga.version"] == 3
    assert start.attributes["messaging.destination.name"] == Partition(TRIPS.name, 0).inbox.key

    [book] = named["saga step book"]
    assert book.kind == SpanKind.CONSUMER
    assert parent_of(book) == start.context.span_id
    assert dict(book.attributes or {}).items() >= {
        "redsaga.saga.id": "t1",
        "redsaga.definition": "trip",
        "redsaga.version": 3,
        "redsaga.context": "trips",
        "redsaga.step": "book",
        "redsaga.kind": "do",
        "redsaga.attempt": 1,
        "redsaga.outcome": "ok",
        "messaging.system": "redis",
        "messaging.operation.type": "process",
        "messaging.consumer.group.name": "hotels",
    }.items()
    [lookup] = named["hotel lookup"]  # the handler's own span nests in the step's
    assert parent_of(lookup) == book.context.span_id

    # after the timer, the next command still carries the saga's trace
    [child_command] = named[f"process {Partition(TRIPS.name, 0).commands('_child').key}"]
    assert parent_of(child_command) == start.context.span_id
    [child_start] = named["saga start visa"]
    assert parent_of(child_start) == child_command.context.span_id
    assert child_start.attributes is not None
    assert child_start.attributes["redsaga.context"] == "visas"
    [stamp] = named["saga step stamp"]
    assert parent_of(stamp) == child_start.context.span_id
    [pay] = named["saga step pay"]
    assert pay.status.status_code == StatusCode.UNSET


async def test_compensation_spans_and_the_failed_step_has_error_status(
    redis: bus.Redis, spans: InMemorySpanExporter
) -> None:
    system = System(redis)
    assert await system.run(Trip(id="t2", pay="declined")) == SagaStatus.COMPENSATED
    named = by_name(list(spans.get_finished_spans()))
    [start] = named["saga start trip"]
    [pay] = named["saga step pay"]
    assert pay.status.status_code == StatusCode.ERROR
    assert pay.status.description == "card declined"
    assert pay.attributes is not None
    assert pay.attributes["redsaga.outcome"] == "permanent"
    assert pay.attributes["error.type"] == "PermanentError"
    [undo] = named["saga compensate book"]
    assert undo.attributes is not None
    assert undo.attributes["redsaga.kind"] == "undo"
    assert undo.attributes["redsaga.outcome"] == "ok"
    assert parent_of(undo) == parent_of(pay) == start.context.span_id
    assert undo.start_time is not None
    assert pay.end_time is not None
    assert undo.start_time >= pay.end_time


async def test_the_saga_keeps_its_trace_in_its_state(redis: bus.Redis, spans: InMemorySpanExporter) -> None:
    system = System(redis)
    await system.client.start("trip", Trip(id="t3"), saga_id="t3")
    [start] = spans.get_finished_spans()
    state = await system.client.get("t3", context=TRIPS.name)
    assert state.trace.startswith(f"00-{start.context.trace_id:032x}-{start.context.span_id:016x}-")
    raw = await redis.hget(Partition(TRIPS.name, 0).saga("t3"), "trace")
    assert raw == state.trace.encode()
