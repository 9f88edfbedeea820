"""One saga across two worker processes yields one trace: the orchestrator's and the participants'.

Each worker is its own process (``tests/tracing/traced_worker.py``: ``saga worker`` with the
SDK writing spans to a file) on a real Redis; this process starts the saga by a request, as a
client without the orchestrator's key would, and keeps the start span in memory. The spans of
all three are read back and joined by trace id and parent links.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import bus
from saga import SagaClient, SagaNotFound, SagaStatus
from tests.faults.procs import Procs
from tests.helpers import eventually
from tests.tracing.test_tracing import asks_its_orchestrator
from tests.tracing.traced_sagas import TRIPS, Trip, orchestrators

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
APPS = "tests.tracing.traced_sagas"


def read_spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def span_id(span: dict[str, Any]) -> str:
    return str(span["context"]["span_id"])


async def test_a_saga_across_an_orchestrator_and_a_participant_process_is_one_trace(
    real_redis: bus.Redis, real_redis_url: str, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    procs = Procs(
        "tests.tracing.traced_worker",
        tmp_path,
        env={"REDSAGA_REDIS_URL": real_redis_url, "REDSAGA_VERIFY": "off"},
    )
    files = {name: tmp_path / f"{name}.spans" for name in ("orchestrators", "services")}
    try:
        workers = [procs.spawn(name, f"{APPS}:{name}", str(path)) for name, path in files.items()]
        for worker in workers:
            await worker.wait_for("worker started", 60)
        client = asks_its_orchestrator(SagaClient(real_redis, orchestrators.registry))
        await client.start("trip", Trip(id="x1", pay="declined"), saga_id="x1")

        async def ended() -> bool:
            try:
                return (await client.get("x1", context=TRIPS.name)).status == SagaStatus.COMPENSATED
            except SagaNotFound:  # the orchestrator has not decided the start request yet
                return False

        await eventually(ended, 60, "the saga is compensated")

        async def end_recorded() -> bool:
            return '"saga end trip"' in files["orchestrators"].read_text()

        await eventually(end_recorded, 30, "the orchestrator records the saga's end")
        for worker in workers:
            worker.terminate()
        for worker in workers:
            assert await worker.wait_exit(60) == 0, procs.tail()
    finally:
        procs.kill_all()

    [start] = spans.get_finished_spans()
    trace_id = f"0x{start.context.trace_id:032x}"
    start_id = f"0x{start.context.span_id:016x}"
    orchestrator, services = read_spans(files["orchestrators"]), read_spans(files["services"])
    assert {s["context"]["trace_id"] for s in orchestrator + services} == {trace_id}  # one trace
    assert {s["resource"]["attributes"]["service.name"] for s in orchestrator} == {"orchestrators"}
    assert {s["resource"]["attributes"]["service.name"] for s in services} == {"services"}

    named = {s["name"]: s for s in services}
    assert set(named) == {"saga step book", "hotel lookup", "saga step pay", "saga compensate book"}
    for name in ("saga step book", "saga step pay", "saga compensate book"):
        assert named[name]["parent_id"] == start_id, name  # the start, made in another process
        assert named[name]["kind"] == "SpanKind.CONSUMER"
    assert named["hotel lookup"]["parent_id"] == span_id(named["saga step book"])
    assert named["saga step pay"]["status"]["status_code"] == "ERROR"
    assert named["saga step pay"]["attributes"]["redsaga.outcome"] == "permanent"
    assert named["saga compensate book"]["attributes"]["redsaga.kind"] == "undo"

    decided = [s for s in orchestrator if s["name"] == "saga decide trip"]
    [end] = [s for s in orchestrator if s["name"] == "saga end trip"]
    assert {s["parent_id"] for s in [*decided, end]} == {start_id}
    assert [s["attributes"]["redsaga.entry"] for s in decided] == ["StartRequested", "Booked", "StepFailed"]
    assert [s["attributes"]["redsaga.status"] for s in decided] == ["running", "running", "compensating"]
    assert end["attributes"]["redsaga.status"] == "compensated"
    assert end["attributes"]["redsaga.saga.id"] == "x1"
    assert end["status"]["status_code"] == "ERROR"
    # in time, each decision follows the step whose reply it decided
    assert decided[1]["start_time"] >= named["saga step book"]["end_time"]
    assert end["start_time"] >= named["saga compensate book"]["end_time"]
