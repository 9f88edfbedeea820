"""docs/time.md: the HTTP callback example and the runner example run as written."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import bus
from bus import FakeClock
from saga import App, EngineConfig, SagaClient, SagaStatus, SagaWorker, ScheduleClient

DOC = (Path(__file__).parents[2] / "docs" / "time.md").read_text(encoding="utf-8")
pytestmark = pytest.mark.anyio


def block(after: str) -> str:
    match = re.search(r"```python\n(.*?)```", DOC[DOC.index(after) :], re.DOTALL)
    assert match, f"docs/time.md lost the example after {after!r}"
    return match.group(1)


async def call(app: Any, query: str, body: bytes) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []
    chunks = [
        {"type": "http.request", "body": body[:5], "more_body": True},
        {"type": "http.request", "body": body[5:]},
    ]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": "POST", "query_string": query.encode()}, receive, send)
    return sent[0]["status"], sent[1]["body"]


async def test_the_http_callback_handler_resumes_once_and_refuses_forgeries() -> None:
    from tests.saga.time_sagas import Loan, loan, participants

    namespace: dict[str, Any] = {}
    exec(compile(block("### An HTTP callback handler"), "docs/time.md", "exec"), namespace)  # noqa: S102
    redis = bus.connect(bus.MEMORY_URL)
    tokens: list[str] = []
    lending = App("lending", sagas=[loan], participants=participants([], tokens))
    clock = FakeClock()
    config = EngineConfig(signal_secret="sixteen bytes at least, yes")
    worker = SagaWorker(redis, lending, config=config, clock=clock)
    client = SagaClient(redis, lending.registry, clock=clock, config=config)
    await client.start(loan, Loan(id="L1", amount=1), saga_id="L1")
    await worker.run_until_idle()
    app = namespace["callback_app"](client)

    assert await call(app, f"token={tokens[0][:-2]}xx", b'{"approved": true, "by": "p"}') == (
        403,
        b"invalid token",
    )
    assert await call(app, f"token={tokens[0]}", b'{"approved": 1}') == (422, b"invalid data")
    assert await call(app, f"token={tokens[0]}", b"{not json") == (422, b"invalid data")
    for _ in range(2):
        assert await call(app, f"token={tokens[0]}", b'{"approved": true, "by": "p"}') == (202, b"accepted")
    await worker.run_until_idle()
    state = await client.get("L1")
    assert state.steps["approval"].status == "succeeded"
    assert state.status == SagaStatus.SUSPENDED
    await redis.aclose()


def test_the_runner_example_runs() -> None:
    from tests.saga.time_sagas import NOON, Approval, FundsReady, Loan, fakes, loan

    ledger, mailer = fakes()
    code = block("## Tests control time")
    exec(  # noqa: S102 - the docs' own code
        compile(code, "docs/time.md", "exec"),
        {"loan": loan, "ledger": ledger, "mailer": mailer, "NOON": NOON, "Loan": Loan}
        | {"Approval": Approval, "FundsReady": FundsReady},
    )


async def test_the_schedule_example_creates_a_schedule_that_skips_bavarian_holidays() -> None:
    from tests.saga.report_sagas import report

    code = block("## Schedules")
    body = "".join(f"    {line}\n" for line in code.splitlines())
    namespace: dict[str, Any] = {}
    exec(compile(f"async def example(redis, app):\n{body}", "docs/time.md", "exec"), namespace)  # noqa: S102
    redis = bus.connect(bus.MEMORY_URL)
    await namespace["example"](redis, App("reports", sagas=[report]))
    [info] = await ScheduleClient(redis, "reports").list()
    assert info.schedule.holiday_calendars == ("DE-BY",)
    berlin = ZoneInfo("Europe/Berlin")
    monday = int(datetime(2026, 1, 5, 2, 30, tzinfo=berlin).timestamp() * 1000)
    wednesday = int(datetime(2026, 1, 7, 2, 30, tzinfo=berlin).timestamp() * 1000)
    assert info.schedule.next_after(monday) == wednesday  # Tuesday 6 January: Epiphany in Bavaria
    await redis.aclose()
