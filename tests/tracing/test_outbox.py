"""An outbox row carries the trace context of the transaction that added it, through the relay."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import bus
import relay
from bus import FakeClock
from bus.tracing import tracer

pytestmark = pytest.mark.anyio


class Shipped(msgspec.Struct, tag=True, frozen=True):
    order: str


async def test_a_row_added_in_a_span_is_consumed_in_its_trace(
    tmp_path: Path, fake_redis: bus.Redis, spans: InMemorySpanExporter
) -> None:
    dsn = f"sqlite:///{tmp_path / 'outbox.db'}"
    await relay.init_db(dsn)
    outbox = relay.Outbox()
    conn = sqlite3.connect(tmp_path / "outbox.db")
    found = tracer()
    assert found is not None
    with found.start_as_current_span("ship order") as shipping:
        outbox.add(conn, "shipping.events", Shipped(order="o1"))  # in the handler's transaction
    outbox.add(conn, "shipping.events", Shipped(order="o2"))  # outside any span: untraced
    conn.commit()
    conn.close()
    await relay.Relay.connect(dsn, fake_redis).run(drain=True)

    app = bus.Bus("billing")
    seen: list[str] = []

    @app.subscribe("shipping.events", group="billing", messages=[Shipped], from_beginning=True)
    async def on_shipped(message: Shipped) -> None:
        seen.append(message.order)

    worker = bus.Worker(fake_redis, app, clock=FakeClock())
    await worker.setup()
    await worker.run_until_idle()
    assert seen == ["o1", "o2"]
    processed = [s for s in spans.get_finished_spans() if s.name.startswith("process ")]
    traced, untraced = processed
    context = shipping.get_span_context()
    assert traced.parent is not None
    assert (traced.parent.span_id, traced.context.trace_id) == (context.span_id, context.trace_id)
    assert untraced.parent is None
