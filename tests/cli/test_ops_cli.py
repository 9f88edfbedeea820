"""Every operations command end to end on real Redis: sagas in every state, an orchestrator
deciding in the background, the commands through typer's runner and as subprocesses."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import typer
from typer.testing import CliRunner, Result

import bus
from redsaga.cli.main import app as cli
from saga import SagaStatus
from saga.ops.trace import replay_trace
from tests.ops.live import Live, live_system
from tests.ops.scenario import FIXED, PARTITION
from tests.ops.scenario import app as ops_app

pytestmark = pytest.mark.redis
runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def live(real_redis_url: str) -> Iterator[Live]:
    with live_system(real_redis_url) as system:
        yield system


def saga(live: Live, *args: str) -> Result:
    return runner.invoke(cli, list(args), env=live.env)


def ok(live: Live, *args: str) -> str:
    result = saga(live, *args)
    assert result.exit_code == 0, result.output
    return result.stdout


def as_json(live: Live, *args: str) -> object:
    return msgspec.json.decode(ok(live, *args, "--json"))


def snapshot(live: Live) -> dict[str, object]:
    """Every key and the length or size of every stream, list and hash: 'nothing changed'."""

    async def read() -> dict[str, object]:
        redis = bus.connect(live.url)
        try:
            shape: dict[str, object] = {}
            for key in sorted(await redis.keys("*")):
                kind = (await redis.type(key)).decode()
                if kind == "stream":
                    shape[key.decode()] = await redis.xlen(key)
                elif kind == "list":
                    shape[key.decode()] = await redis.llen(key)
                elif kind == "hash":
                    shape[key.decode()] = await redis.hgetall(key)
                else:
                    shape[key.decode()] = kind
            return shape
        finally:
            await redis.aclose()

    return anyio.run(read)


def status_of(live: Live, saga_id: str) -> str:
    return as_json(live, "inspect", saga_id)["status"]  # type: ignore[index]


# -- reading --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("completed", "nothing: the saga ended (completed)"),
        ("compensated", "nothing: the saga ended (compensated)"),
        ("failed", "nothing: the saga ended (failed)"),
        ("cancelled", "nothing: the saga ended (cancelled)"),
        ("running", "a reply from inventory to ReserveStock"),
        ("dead_lettered", "an operator: arrange_shipping ran out of attempts"),
        ("dead_lettered_undo", "an operator: the compensation of charge_payment ran out of attempts"),
    ],
)
def test_inspect_every_state(live: Live, state: str, expected: str) -> None:
    text = ok(live, "inspect", live.ids[state])
    assert f"saga {live.ids[state]}" in text
    assert expected in text
    for section in ("steps", "attempts", "history"):
        assert f"\n{section}" in text
    found = as_json(live, "inspect", live.ids[state])
    assert found["waiting_for"].startswith(expected)  # type: ignore[index]


def test_inspect_shows_errors_timers_letters_and_the_full_history(live: Live) -> None:
    dead = ok(live, "inspect", live.ids["dead_lettered_undo"], "--history")
    assert "error chain TransientError: payment gateway timeout" in dead
    assert "<- ConnectionResetError: peer reset" in dead
    assert "attempt inputs" in dead
    assert '"type":"RefundCard"' in dead
    stuck = ok(live, "inspect", live.ids["running"])
    assert "pending timers" in stuck
    assert "ord-stuck:reserve_stock:do:1:timeout" in stuck
    assert "dead letters naming this saga" in stuck
    assert "expects a StockReserved reply, got CardRefunded" in stuck


def test_inspect_graph_draws_the_path(live: Live) -> None:
    mermaid = ok(live, "inspect", live.ids["compensated"], "--graph")
    assert mermaid.startswith("flowchart LR")
    classes = {
        line.split()[2]: line.split()[1].split(",") for line in mermaid.splitlines() if "    class " in line
    }
    assert classes == {
        "done": ["undo_reserve_stock", "compensated"],
        "failed": ["charge_payment"],
        "undone": ["reserve_stock"],
    }
    dot = ok(live, "inspect", live.ids["compensated"], "--graph", "--format", "dot")
    assert '"charge_payment" [label="charge_payment\\nreply CardCharged", shape=box, style=filled' in dot
    assert "penwidth=3" in dot
    both = as_json(live, "inspect", live.ids["completed"], "--graph")
    assert both["graph"].startswith("flowchart LR")  # type: ignore[index]


def test_list_by_status_stuck_paginated_and_counted(live: Live) -> None:
    dead = ok(live, "list", "--status", "dead_lettered")
    assert "ord-dead " in dead
    assert "ord-refund-down" in dead
    assert "1-2 of 2" in dead
    stuck = as_json(live, "list", "--stuck-for", "10m")
    assert [r["id"] for r in stuck["rows"]][-1] == "ord-stuck"  # type: ignore[index]
    first = ok(live, "list", "--stuck-for", "10m", "--limit", "1")
    assert "next page: --offset 1" in first
    counts = ok(live, "list", "--count")
    assert "total 7" in counts
    # one documented shape for --count, with or without --stuck-for
    stuck_count = as_json(live, "list", "--count", "--stuck-for", "10m")
    assert stuck_count == {
        "total": 3,
        "counts": [
            {"definition": "order_fulfilment", "version": 1, "status": "dead_lettered", "count": 2},
            {"definition": "order_fulfilment", "version": 1, "status": "running", "count": 1},
        ],
        "stuck_for_ms": 600_000,
        "waiting": 0,
    }
    all_count = as_json(live, "list", "--count")
    assert set(all_count) == set(stuck_count)  # type: ignore[arg-type]
    assert (all_count["total"], all_count["stuck_for_ms"], all_count["waiting"]) == (7, None, None)  # type: ignore[index]
    # list --json carries the total over all pages
    page = as_json(live, "list", "--limit", "2")
    assert (page["total"], len(page["rows"]), page["next_offset"]) == (7, 2, 2)  # type: ignore[index]
    none = as_json(live, "list", "--definition", "order_fulfilment", "--version", "2")
    assert (none["rows"], none["total"]) == ([], 0)  # type: ignore[index]
    assert len(as_json(live, "list", "-s", "failed", "-s", "cancelled")["rows"]) == 2  # type: ignore[index]
    unknown = saga(live, "list", "--definition", "nosuch")
    assert unknown.exit_code == 1
    assert unknown.stderr == "error: no definition named 'nosuch' (known: order_fulfilment)\n"


def test_replay_reports_every_decision_matching(live: Live) -> None:
    for saga_id in live.ids.values():
        assert "every decision matches" in ok(live, "replay", saga_id)


def test_export_writes_a_trace_that_replays(live: Live, tmp_path: Path) -> None:
    trace = ok(live, "export", live.ids["compensated"])
    assert replay_trace(trace, ops_app).status == SagaStatus.COMPENSATED
    target = tmp_path / "trace.json"
    result = saga(live, "export", live.ids["dead_lettered"], "--output", str(target))
    assert result.exit_code == 0
    assert "wrote the trace of ord-dead (12 events)" in result.stderr
    assert replay_trace(target, ops_app).status == SagaStatus.DEAD_LETTERED


def test_stats(live: Live, tmp_path: Path) -> None:
    text = ok(live, "stats")
    assert "in flight 3" in text
    assert "rs:{orders:0}:cmd:shipping" in text
    assert "rs:{orders:0}:dlq   2" in text
    found = as_json(live, "stats", "--stuck-for", "1d", "--dsn", f"sqlite:///{tmp_path}/missing.db")
    assert found["stuck"] == 0  # type: ignore[index]
    assert found["outbox"][0]["error"]  # type: ignore[index]


# -- acting ---------------------------------------------------------------------------------


def test_force_complete_a_dead_lettered_step(live: Live) -> None:
    text = ok(
        live,
        "force-complete",
        live.ids["dead_lettered"],
        "--step",
        "arrange_shipping",
        "--output",
        '{"tracking": "phoned-in"}',
        "--reason",
        "booked by phone, INC-7",
    )
    assert "force-complete of ord-dead applied" in text
    assert "now completed" in text
    assert "alice@ops: booked by phone, INC-7" in text
    assert status_of(live, live.ids["dead_lettered"]) == "completed"


def test_force_complete_a_failed_compensation(live: Live) -> None:
    result = as_json(
        live,
        "force-complete",
        live.ids["dead_lettered_undo"],
        "--step",
        "charge_payment",
        "--output",
        '{"refund_id": "manual"}',
        "--reason",
        "refunded by hand",
    )
    assert result["outcome"] == "applied"  # type: ignore[index]
    assert result["dispatched"] == ["reserve_stock/undo #1 -> inventory ReleaseStock"]  # type: ignore[index]


def test_retry_and_cancel(live: Live) -> None:
    FIXED.add(live.ids["dead_lettered"])
    retried = ok(live, "retry", live.ids["dead_lettered"], "--reason", "carrier is back")
    assert "sends       arrange_shipping/do #6 -> shipping ArrangeShipping" in retried
    cancelled = as_json(live, "cancel", live.ids["running"], "--reason", "customer called")
    assert cancelled["outcome"] == "applied"  # type: ignore[index]
    assert cancelled["by"] == "alice@ops"  # type: ignore[index]


def test_replay_from_a_step_dry_run_then_for_real(live: Live) -> None:
    before = snapshot(live)
    plan = ok(live, "replay", live.ids["running"], "--from-step", "reserve_stock", "--dry-run")
    assert "dry run: redrive of ord-stuck would apply; nothing was sent" in plan
    assert "reserve_stock/do #2 -> inventory ReserveStock" in plan
    assert snapshot(live) == before
    done = as_json(
        live, "replay", live.ids["running"], "--from-step", "reserve_stock", "--reason", "lost command"
    )
    assert done["redrive"]["outcome"] == "applied"  # type: ignore[index]
    assert done["replay"]["mismatch"] is None  # type: ignore[index]


def test_an_action_with_no_orchestrator_running_is_reported_queued(real_redis_url: str) -> None:
    from tests.ops.live import flush, prepare

    scenario = prepare(real_redis_url)
    live = Live(url=real_redis_url, scenario=scenario)
    try:
        result = saga(live, "cancel", scenario.ids["running"], "--wait", "0.2")
    finally:
        flush(real_redis_url)
    assert result.exit_code == 3
    assert "not decided yet: is a worker running for this context?" in result.stdout


def test_start(live: Live) -> None:
    data = '{"id":"o-77","customer":"c","lines":[{"sku":"s","quantity":1}],"total_cents":100}'
    assert ok(live, "start", "order_fulfilment", "--data", data, "--id", "o-77").strip() == "o-77"
    assert as_json(live, "start", "order_fulfilment@1", "--data", data, "--id", "o-77") == {"id": "o-77"}
    # the same id with other data is refused, naming the saga; the first data stays
    other = data.replace('"total_cents":100', '"total_cents":999')
    conflict = saga(live, "start", "order_fulfilment", "--data", other, "--id", "o-77")
    assert conflict.exit_code == 1
    assert conflict.stderr == (
        "error: saga 'o-77' exists (order_fulfilment@1) with other data; the new data was not stored "
        "(start it with another id, or cancel the existing saga first)\n"
    )
    found = as_json(live, "inspect", "o-77")
    assert found["data"]["total_cents"] == 100  # type: ignore[index]
    assert found["timeline"][0]["summary"] == "started by alice@ops"  # type: ignore[index]


def test_dlq_list_says_when_it_stops_at_its_limit_and_pages_on(live: Live) -> None:
    everything = as_json(live, "dlq", "list")
    assert len(everything) == 2  # type: ignore[arg-type]
    first = saga(live, "dlq", "list", "--limit", "1")
    assert first.exit_code == 0
    assert first.stdout.endswith("\nstopped at --limit 1: more letters match; next page: --offset 1\n")
    first_json = saga(live, "dlq", "list", "--limit", "1", "--json")
    assert msgspec.json.decode(first_json.stdout) == everything[:1]  # type: ignore[index]
    assert first_json.stderr == "stopped at --limit 1: more letters match; next page: --offset 1\n"
    last = saga(live, "dlq", "list", "--limit", "1", "--offset", "1", "--json")
    assert msgspec.json.decode(last.stdout) == everything[1:]  # type: ignore[index]
    assert last.stderr == ""
    assert "more letters match" not in ok(live, "dlq", "list", "--limit", "2")


def test_dead_letter_commands(live: Live) -> None:
    letters = as_json(live, "dlq", "list")
    assert [x["stream"] for x in letters] == [PARTITION.inbox.key] * 2  # type: ignore[union-attr]
    bad_reply = letters[1]["id"]  # type: ignore[index]
    shown = ok(live, "dlq", "show", bad_reply)
    assert "reason      permanent failure" in shown
    assert "raw entry" in shown
    assert "can be requeued" in shown
    assert "ord-stuck" in ok(live, "dlq", "list", "--saga", "ord-stuck")
    assert as_json(live, "dlq", "list", "--stream", "cmd:payments") == []

    requeued = as_json(live, "dlq", "requeue", bad_reply)
    assert requeued[0]["outcome"] == "requeued"  # type: ignore[index]
    # gone: a second requeue of the id is an error, like dlq show, and changes nothing
    before = snapshot(live)
    twice = saga(live, "dlq", "requeue", bad_reply)
    assert (twice.exit_code, twice.stderr) == (1, f"error: no dead letter {bad_reply!r}\n")
    unknown = saga(live, "dlq", "requeue", "0-1", letters[0]["id"])  # type: ignore[index]
    assert (unknown.exit_code, unknown.stderr) == (1, "error: no dead letter '0-1'\n")
    assert snapshot(live) == before

    refused = saga(live, "dlq", "purge", "--all")
    assert refused.exit_code == 1
    assert "add --yes" in refused.stderr
    assert "purged" in ok(live, "dlq", "purge", "--all", "--yes")
    assert as_json(live, "dlq", "list", "--reason", "malformed") == []


# -- bad input: one line, exit 1, nothing changed ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            [
                "force-complete",
                "ord-dead",
                "--step",
                "arrange_shipping",
                "--output",
                "{nope",
                "--reason",
                "r",
            ],
            "error: the output is not valid JSON",
        ),
        (
            [
                "force-complete",
                "ord-dead",
                "--step",
                "arrange_shipping",
                "--output",
                '{"tracking": 1}',
                "--reason",
                "r",
            ],
            "error: the output is not a valid ShipmentArranged for order_fulfilment@1.arrange_shipping",
        ),
        (
            ["force-complete", "ord-dead", "--step", "ship_it", "--output", "{}", "--reason", "r"],
            "error: unknown step 'ship_it' in order_fulfilment@1",
        ),
        (
            ["force-complete", "ord-dead", "--step", "arrange_shipping", "--output", "{}", "--reason", " "],
            "error: force-complete needs a reason",
        ),
        (["inspect", "no-such-saga"], "error: no saga with id 'no-such-saga'"),
        (["retry", "ord-completed"], "retry applies to dead-lettered sagas, this one is completed"),
        (["cancel", "ord-completed"], "the saga has already ended (completed)"),
        (
            ["replay", "ord-no-stock", "--from-step", "reserve_stock", "--reason", "r"],
            "an ended saga is not reopened",
        ),
        (["replay", "ord-stuck", "--from-step", "reserve_stock"], "error: --from-step needs --reason"),
        (["start", "order_fulfilment", "--data", "[1, 2"], "error: data is not a valid Order"),
        (["start", "no_such_saga", "--data", "{}"], "error: no definition named 'no_such_saga'"),
        (["dlq", "requeue"], "error: name the letters"),
        (["dlq", "show", "1-1"], "error: no dead letter '1-1'"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(live: Live, args: list[str], message: str) -> None:
    before = snapshot(live)
    result = saga(live, *args)
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output
    assert snapshot(live) == before


def test_unreachable_redis_and_missing_options(tmp_path: Path) -> None:
    env = {"REDSAGA_REDIS_URL": "redis://127.0.0.1:1/0", "REDSAGA_APP": "tests.ops.scenario:app"}
    for args in (["inspect", "x"], ["list"], ["stats"], ["dlq", "list"], ["cancel", "x"]):
        result = runner.invoke(cli, args, env=env)
        assert result.exit_code == 1
        assert result.stderr.startswith("error: Redis unavailable")
        assert len(result.stderr.strip().splitlines()) == 1
    no_url = runner.invoke(
        cli, ["list"], env={"REDSAGA_REDIS_URL": "", "REDSAGA_APP": "tests.ops.scenario:app"}
    )
    assert no_url.exit_code == 2
    assert "error: no Redis to use: pass --redis-url URL or set REDSAGA_REDIS_URL" in no_url.stderr
    not_app = runner.invoke(cli, ["list", "--app", "redsaga.examples.orders:order_fulfilment"], env=env)
    assert "is a Saga, not a saga.App or saga.Registry" in not_app.stderr


# -- as subprocesses -------------------------------------------------------------------------------


SUBPROCESS_GROUP_A = [
    (["inspect", "ord-dead"], 0, "an operator: arrange_shipping ran out of attempts"),
    (["inspect", "ord-dead", "--graph", "--format", "dot"], 0, 'digraph "order_fulfilment@1 saga ord-dead'),
    (["list", "--stuck-for", "10m"], 0, "1-3 of 3"),
    (["list", "--count", "--json"], 0, '"status": "dead_lettered"'),
    (["replay", "ord-compensated"], 0, "every decision matches"),
    (
        [
            "force-complete",
            "ord-dead",
            "--step",
            "arrange_shipping",
            "--output",
            '{"tracking":"t"}',
            "--reason",
            "r",
        ],
        0,
        "now completed",
    ),
    (["retry", "ord-refund-down"], 0, "retry of ord-refund-down applied"),
    (["export", "ord-completed"], 0, '"format": "redsaga.trace/1"'),
    (["stats", "--json"], 0, '"in_flight": '),
    (["start", "order_fulfilment", "--data", '{"id":"n","customer":"c","lines":[],"total_cents":1}'], 0, ""),
    (["dlq", "list"], 0, "malformed entry"),
    (["dlq", "purge", "--all", "--yes"], 0, "purged 2 dead letter(s)"),
    (["force-complete", "ord-dead", "--step", "x", "--output", "{}", "--reason", "r"], 1, "unknown step 'x'"),
]
SUBPROCESS_GROUP_B = [
    (["cancel", "ord-dead", "--reason", "r"], 0, "cancel of ord-dead applied"),
    (
        ["replay", "ord-stuck", "--from-step", "reserve_stock", "--reason", "lost"],
        0,
        "redrive of ord-stuck applied",
    ),
    (["dlq", "requeue", "--stream", "inbox"], 0, "requeued"),
    (["dlq", "show", "0-1"], 1, "no dead letter '0-1'"),
]


@pytest.mark.parametrize("cases", [SUBPROCESS_GROUP_A, SUBPROCESS_GROUP_B], ids=["a", "b"])
def test_every_command_as_a_subprocess(live: Live, cases: list[tuple[list[str], int, str]]) -> None:
    for args, code, expected in cases:
        done = subprocess.run(
            [sys.executable, "-m", "redsaga.cli", *args],
            env=live.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == code, (args, done.stdout, done.stderr)
        assert expected in (done.stdout if code == 0 else done.stderr), (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr


# -- help ------------------------------------------------------------------------------------------

COMMANDS = ["start", "inspect", "list", "replay", "force-complete", "cancel", "retry", "export", "stats"]


def test_saga_help_lists_every_command() -> None:
    result = runner.invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in [*COMMANDS, "dlq", "graph", "worker", "demo", "relay"]:
        assert f" {name} " in result.stdout
    assert "saga signal" not in result.stdout  # signals belong to another issue


def _commands(group: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def test_every_command_and_option_has_help() -> None:
    root = typer.main.get_command(cli)
    for path, command in _commands(root):
        assert command.help, f"saga {' '.join(path)} has no help"
        for param in command.params:
            if param.param_type_name == "option" and param.name != "help":
                assert param.help, f"saga {' '.join(path)} {param.opts[0]} has no help"
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, path
        assert "Usage: saga" in result.stdout
