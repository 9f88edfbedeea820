"""OpenTelemetry tracing: one trace per saga across the orchestrator and its participants.

The SDK's in-memory exporter collects every span the workers make; the orchestrators and the
participants run as two workers (two services) on fakeredis and on a real Redis.
"""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from structlog.testing import capture_logs

import bus
import bus._tracing as bus_tracing
from bus import FakeClock
from saga import EngineConfig, SagaClient, SagaStatus, SagaWorker
from saga.store.keys import Partition
from tests.helpers import envelope_items
from tests.tracing.traced_sagas import TRIPS, Trip, orchestrators, services

pytestmark = pytest.mark.anyio
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))


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
        await self.client.start("trip", data, saga_id=data.id, wait_s=0)
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
    assert (
        dict(book.attributes or {}).items()
        >= {
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
    )
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

    # every entry the orchestrator decided is a span in the saga's trace; the last ends it
    decided = named["saga decide trip"]
    assert {parent_of(span) for span in decided} == {start.context.span_id}
    assert {dict(span.attributes or {}).get("redsaga.step") for span in decided} >= {"book", "pay"}
    [end] = named["saga end trip"]
    assert end.kind == SpanKind.CONSUMER
    assert end.status.status_code == StatusCode.UNSET
    assert (
        dict(end.attributes or {}).items()
        >= {"redsaga.saga.id": "t1", "redsaga.status": "completed", "redsaga.step": "papers"}.items()
    )
    assert end.start_time is not None
    assert stamp.end_time is not None
    assert end.start_time >= stamp.end_time
    [visa_end] = named["saga end visa"]
    assert parent_of(visa_end) == child_start.context.span_id


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
    [end] = named["saga end trip"]
    assert end.status.status_code == StatusCode.ERROR
    assert end.status.description == "saga compensated"
    assert end.attributes is not None
    assert (end.attributes["redsaga.status"], end.attributes["redsaga.step"]) == ("compensated", "book")
    assert end.attributes["redsaga.entry"] == "Cancelled"  # the compensation's reply ended it
    failed = [s for s in named["saga decide trip"] if (s.attributes or {})["redsaga.entry"] == "StepFailed"]
    assert [dict(s.attributes or {})["redsaga.status"] for s in failed] == ["compensating"]


async def test_the_saga_keeps_its_trace_in_its_state(redis: bus.Redis, spans: InMemorySpanExporter) -> None:
    system = System(redis)
    await system.client.start("trip", Trip(id="t3"), saga_id="t3", wait_s=0)
    [start] = spans.get_finished_spans()
    state = await system.client.get("t3", context=TRIPS.name)
    assert state.trace.startswith(f"00-{start.context.trace_id:032x}-{start.context.span_id:016x}-")
    raw = await redis.hget(Partition(TRIPS.name, 0).saga("t3"), "trace")
    assert raw == state.trace.encode()


def asks_its_orchestrator(client: SagaClient) -> SagaClient:
    """The client as one without the orchestrator's keyring: it starts sagas by a request."""
    client.orchestrates = lambda _context: False  # type: ignore[method-assign]
    return client


async def commands_of(redis: bus.Redis, participant: str) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in await redis.xrange(Partition(TRIPS.name, 0).commands(participant).key)]


async def test_a_start_request_carries_the_start_span_to_the_orchestrator(
    fake_redis: bus.Redis, spans: InMemorySpanExporter
) -> None:
    system = System(fake_redis)
    asks_its_orchestrator(system.client)
    assert await system.run(Trip(id="t4")) == SagaStatus.COMPLETED
    named = by_name(list(spans.get_finished_spans()))
    [start] = named["saga start trip"]
    [book] = named["saga step book"]
    assert parent_of(book) == start.context.span_id
    assert book.context.trace_id == start.context.trace_id
    [started] = [
        s for s in named["saga decide trip"] if (s.attributes or {})["redsaga.entry"] == "StartRequested"
    ]
    assert parent_of(started) == start.context.span_id  # the orchestrator decided the request
    assert dict(started.attributes or {})["redsaga.status"] == "running"


async def test_nothing_is_traced_without_a_tracer_provider(fake_redis: bus.Redis) -> None:
    system = System(fake_redis)
    assert await system.run(Trip(id="t5")) == SagaStatus.COMPLETED
    assert await fake_redis.hget(Partition(TRIPS.name, 0).saga("t5"), "trace") is None
    [command] = await commands_of(fake_redis, "hotels")
    assert "traceparent" not in envelope_items(command)["hdr"]


async def test_a_process_that_does_not_trace_passes_the_trace_on(fake_redis: bus.Redis) -> None:
    """No tracer here: the trace context a start request brings is kept and sent on as it is."""
    system = System(fake_redis)
    asks_its_orchestrator(system.client)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await system.client.start("trip", Trip(id="t6"), saga_id="t6", trace=(parent, "vendor=x"), wait_s=0)
    await system.settle()
    state = await system.client.get("t6", context=TRIPS.name)
    assert (state.trace, state.trace_state) == (parent, "vendor=x")
    [command] = await commands_of(fake_redis, "hotels")
    assert envelope_items(command)["hdr"]["traceparent"] == parent


async def test_a_malformed_traceparent_is_ignored_and_logged_once(
    fake_redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start request with a broken context starts its saga untraced (no dead letter)."""
    monkeypatch.setitem(bus_tracing._state, "warned", False)
    system = System(fake_redis)
    asks_its_orchestrator(system.client)
    with capture_logs() as logs:
        for trip_id in ("t7", "t8"):
            await system.client.start(
                "trip", Trip(id=trip_id), saga_id=trip_id, trace=("00-nonsense-01", ""), wait_s=0
            )
        await system.orchestrators.run_until_idle()
    for trip_id in ("t7", "t8"):
        state = await system.client.get(trip_id, context=TRIPS.name)
        assert state.status == SagaStatus.RUNNING  # started, not dead-lettered
        assert state.trace == ""
    assert await fake_redis.xlen(Partition(TRIPS.name, 0).inbox.dlq_key) == 0
    warnings = [log for log in logs if "malformed traceparent" in log["event"]]
    assert len(warnings) == 1
    assert warnings[0]["traceparent"] == "00-nonsense-01"


class Ping(msgspec.Struct, tag=True, frozen=True):
    n: int


@pytest.mark.parametrize(
    "traceparent",
    [
        "garbage",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # the invalid trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # the invalid span id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # the forbidden version
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
    ],
)
async def test_a_traced_handler_of_an_entry_with_a_malformed_traceparent_runs_in_a_root_span(
    fake_redis: bus.Redis, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch, traceparent: str
) -> None:
    monkeypatch.setitem(bus_tracing._state, "warned", False)
    app = bus.Bus("pinger")
    seen: list[int] = []

    @app.handler("pings", Ping)
    async def on_ping(message: Ping) -> None:
        seen.append(message.n)

    worker = bus.Worker(fake_redis, app, clock=FakeClock())
    await worker.setup()
    publisher = bus.Publisher(fake_redis)
    with capture_logs() as logs:
        await publisher.publish("pings", Ping(n=1), headers={"traceparent": traceparent})
        await publisher.publish("pings", Ping(n=2), headers={"traceparent": traceparent})
        await worker.run_until_idle()
    assert seen == [1, 2]
    found = [s for s in spans.get_finished_spans() if s.name == f"process {bus.Stream.named('pings').key}"]
    assert [s.parent for s in found] == [None, None]
    assert len({s.context.trace_id for s in found}) == 2
    assert len([log for log in logs if "malformed traceparent" in log["event"]]) == 1
    assert await fake_redis.xlen(bus.Stream.named("pings").dlq_key) == 0


async def test_a_domain_event_carries_its_publishers_span_to_the_saga_it_starts(
    fake_redis: bus.Redis, spans: InMemorySpanExporter
) -> None:
    """A subscriber that starts a saga: the start is a child of the event's process span."""
    system = System(fake_redis)
    app = bus.Bus("trip-desk")

    @app.subscribe("desk.events", group="desk", messages=[Ping], from_beginning=True)
    async def on_request(message: Ping) -> None:
        await system.client.start("trip", Trip(id=f"t-{message.n}"), saga_id=f"t-{message.n}", wait_s=0)

    worker = bus.Worker(fake_redis, app, clock=system.clock)
    await worker.setup()
    found = bus_tracing.tracer()
    assert found is not None
    with found.start_as_current_span("order placed") as placed:
        await bus.Publisher(fake_redis).publish("desk.events", Ping(n=9))
    await worker.run_until_idle()
    await system.settle()
    named = by_name(list(spans.get_finished_spans()))
    [process] = named[f"process {bus.Stream.named('desk.events').key}"]
    [start] = named["saga start trip"]
    [book] = named["saga step book"]
    assert parent_of(process) == placed.get_span_context().span_id
    assert parent_of(start) == process.context.span_id
    assert parent_of(book) == start.context.span_id
    assert {process.context.trace_id, start.context.trace_id, book.context.trace_id} == {
        placed.get_span_context().trace_id
    }


NO_OPENTELEMETRY = """
import sys
sys.modules["opentelemetry"] = None  # as if the tracing extra were not installed
import anyio, bus
from bus.tracing import carried, tracer
from saga import SagaClient
from tests.tracing.traced_sagas import TRIPS, Trip, orchestrators

async def main():
    assert tracer() is None
    redis = bus.connect(bus.MEMORY_URL)
    client = SagaClient(redis, orchestrators.registry)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await client.start("trip", Trip(id="a"), saga_id="a", trace=(parent, ""), wait_s=0)
    assert (await client.get("a", context=TRIPS.name)).trace == parent
    print("ok")

anyio.run(main)
"""


def test_without_opentelemetry_the_trace_context_still_travels() -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_OPENTELEMETRY], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


async def test_a_signal_is_a_span_in_the_sagas_trace(
    fake_redis: bus.Redis, spans: InMemorySpanExporter
) -> None:
    system = System(fake_redis)
    await system.client.start("approval", Trip(id="a1"), saga_id="a1", wait_s=0)
    await system.settle()
    wait = (await system.client.query("a1", context=TRIPS.name)).wait
    assert wait is not None
    assert wait.token is not None
    token = wait.token
    await system.client.signal(token)
    await system.settle()
    assert (await system.client.get("a1", context=TRIPS.name)).status == SagaStatus.COMPLETED
    named = by_name(list(spans.get_finished_spans()))
    [start] = named["saga start approval"]
    [signal] = named["saga signal ok"]
    [book] = named["saga step book_approved"]
    assert signal.kind == SpanKind.PRODUCER
    assert parent_of(signal) == parent_of(book) == start.context.span_id
    assert signal.context.trace_id == start.context.trace_id
