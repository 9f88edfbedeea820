"""``saga signal`` and ``saga schedule …`` against real Redis."""

from __future__ import annotations

import re

import anyio
import msgspec
import pytest
from typer.testing import CliRunner

import bus
from bus import FakeClock
from redsaga.cli.main import app
from saga import App, EngineConfig, SagaClient, SagaStatus, SagaWorker
from tests.saga.report_sagas import report
from tests.saga.time_sagas import Loan, loan, participants

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
runner = CliRunner()


def saga_cli(url: str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, [*args, "--redis-url", url])
    return result.exit_code, result.stdout + result.stderr


async def saga_cli_async(url: str, *args: str) -> tuple[int, str]:
    """The CLI runs its own event loop: from an async test, on a thread."""
    return await anyio.to_thread.run_sync(lambda: saga_cli(url, *args))


async def test_signal_from_the_command_line_resumes_once_and_refuses_forgeries(
    real_redis: bus.Redis, real_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDSAGA_SIGNAL_SECRET", raising=False)  # the secret generated in Redis
    tokens: list[str] = []
    lending = App("lending", sagas=[loan], participants=participants([], tokens))
    clock = FakeClock()
    config = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))
    worker = SagaWorker(real_redis, lending, config=config, clock=clock)
    client = SagaClient(real_redis, lending.registry, clock=clock, config=config)
    await client.start(loan, Loan(id="L1", amount=1), saga_id="L1")
    await worker.run_until_idle()

    forged = tokens[0][:-3] + ("abc" if not tokens[0].endswith("abc") else "xyz")
    code, output = await saga_cli_async(
        real_redis_url, "signal", forged, "--data", '{"approved": true, "by": "x"}'
    )
    assert code == 1
    assert "error: resume token is not valid" in output

    code, output = await saga_cli_async(
        real_redis_url,
        "signal",
        tokens[0],
        "--data",
        '{"approved": "maybe"}',
        "--app",
        "tests.cli.test_time:LENDING",
    )
    assert code == 1
    assert "not a valid Approval" in output

    code, output = await saga_cli_async(
        real_redis_url, "signal", tokens[0], "--data", '{"approved": true, "by": "ann"}'
    )
    assert code == 0, output
    assert output.startswith("signal delivered")
    await worker.run_until_idle()
    state = await client.get("L1")
    assert state.steps["approval"].status == "succeeded"
    assert state.status == SagaStatus.SUSPENDED  # cooling off

    code, output = await saga_cli_async(
        real_redis_url, "signal", tokens[0], "--data", '{"approved": true, "by": "ann"}'
    )
    assert code == 1  # a repeat: said so, nothing sent
    assert "error: wait 1 of step 'approval' in saga 'L1' has ended (resumed)" in output


LENDING = App("lending", sagas=[loan], participants=participants([], []))


def test_schedules_from_the_command_line(real_redis_url: str) -> None:
    code, output = saga_cli(
        real_redis_url,
        "schedule",
        "create",
        "nightly",
        "--context",
        "reports",
        "--saga",
        "report",
        "--data",
        '{"name": "n"}',
        "--cron",
        "30 2 * * mon-fri",
        "--timezone",
        "Europe/Berlin",
        "--holiday",
        "2026-12-24",
        "--holiday-calendar",
        "DE-BY",
        "--overlap",
        "buffer_one",
    )
    assert code == 0, output
    code, output = saga_cli(real_redis_url, "schedule", "list", "--context", "reports", "--json")
    assert code == 0, output
    [info] = msgspec.json.decode(output)
    assert info["schedule"]["cron"] == "30 2 * * mon-fri"
    assert info["schedule"]["holidays"] == ["2026-12-24"]
    assert info["schedule"]["holiday_calendars"] == ["DE-BY"]
    assert info["state"]["next_ms"] > 0

    for action, check in (("pause", "paused"), ("resume", "active"), ("trigger", "active")):
        code, output = saga_cli(real_redis_url, "schedule", action, "nightly", "--context", "reports")
        assert code == 0, output
        assert check in output
    code, output = saga_cli(real_redis_url, "schedule", "list", "--context", "reports", "--json")
    assert len(msgspec.json.decode(output)[0]["state"]["triggers"]) == 1

    code, output = saga_cli(
        real_redis_url, "schedule", "create", "bad", "-c", "reports", "--saga", "r", "--cron", "x"
    )
    assert code == 2  # bad usage
    assert "expected 5 fields" in output
    code, output = saga_cli(
        real_redis_url, "schedule", "create", "bad", "-c", "reports", "--saga", "r", "--cron", "@daily",
        "--holiday-calendar", "DE-XX",
    )  # fmt: skip
    assert code == 2  # an option value that names nothing: bad usage
    assert output.startswith("error: holiday calendar 'DE-XX': DE has no subdivision 'XX' (it has: BB, BE, ")
    assert output.count("\n") == 1  # one line
    code, output = saga_cli(real_redis_url, "schedule", "delete", "nightly", "--context", "reports")
    assert code == 0
    code, output = saga_cli(real_redis_url, "schedule", "pause", "nightly", "--context", "reports")
    assert code == 1
    assert "no schedule with id 'nightly'" in output


REPORTING = App("reporting", sagas=[report])


async def test_a_schedule_for_an_unknown_saga_is_refused_or_listed_as_broken(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    typo = ("typo", "-c", "reports", "--saga", "nosuchsaga", "--cron", "0 3 * * *")
    code, output = await saga_cli_async(
        real_redis_url, "schedule", "create", *typo, "--app", "tests.cli.test_time:REPORTING"
    )
    assert (code, output) == (
        1,
        "error: schedule 'typo': no saga named 'nosuchsaga' in context 'reports' (known: report)\n",
    )

    # nothing can know here (no --app, no worker registered the context): the worker decides
    code, output = await saga_cli_async(real_redis_url, "schedule", "create", *typo)
    assert code == 0, output
    code, output = await saga_cli_async(real_redis_url, "schedule", "trigger", "typo", "-c", "reports")
    assert code == 0, output
    worker = SagaWorker(real_redis, REPORTING, config=EngineConfig(bus=bus.BusConfig(lease_ms=10_000)))
    await worker.run_until_idle()

    code, output = await saga_cli_async(real_redis_url, "schedule", "list", "-c", "reports")
    assert code == 0, output
    table, reason, advice = output.splitlines()[1:]
    assert table.split()[:2] == ["typo", "nosuchsaga"]
    assert "broken" in table
    assert reason.startswith("typo: broken since ")
    # one time format in every table: 2026-12-04 12:16:48Z
    assert re.match(r"typo: broken since \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ: ", reason), reason
    assert reason.endswith(
        ": no saga named 'nosuchsaga' in context 'reports' is known to the worker that fired it "
        "(it knows: report)"
    )
    assert advice.startswith("A broken schedule starts nothing.")
    await worker.register()  # what run() does first: Redis now knows the context
    everywhere = await saga_cli_async(real_redis_url, "schedule", "list")  # every registered context
    assert everywhere == (code, output)
    code, output = await saga_cli_async(real_redis_url, "schedule", "list", "-c", "reports", "--json")
    [info] = msgspec.json.decode(output)
    assert set(info) == {"schedule", "state", "revision", "due_ms"}
    assert set(info["state"]["broken"]) == {"reason", "at_ms"}
    assert info["state"]["paused"] is False  # every field is there, defaults too
    assert info["schedule"]["holiday_calendars"] == []

    # once a worker registered the context's sagas, the CLI knows without --app
    await worker.register()
    code, output = await saga_cli_async(real_redis_url, "schedule", "trigger", "typo", "-c", "reports")
    assert (code, output) == (
        1,
        "error: schedule 'typo': no saga named 'nosuchsaga' in context 'reports' (known: report)\n",
    )
    code, output = await saga_cli_async(real_redis_url, "schedule", "create", *typo, "--replace")
    assert code == 1
    fixed = ("typo", "-c", "reports", "--saga", "report", "--cron", "0 3 * * *", "--replace", "--json")
    code, output = await saga_cli_async(real_redis_url, "schedule", "create", *fixed)
    assert code == 0, output
    assert msgspec.json.decode(output)[0]["state"]["broken"] is None
