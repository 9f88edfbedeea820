"""With --json, stdout is exactly one JSON document: every command that takes --json, run for
real against the operations scenario, a saga waiting for a signal, versioned sagas, a
schedule and an outbox with a failed row. Logs and notes go to stderr."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import structlog
import typer
from typer.testing import CliRunner

import bus
import relay
from bus import FakeClock
from redsaga.cli.main import app
from saga import App, SagaClient, SagaWorker
from tests.cli.task_world import AUTHORIZER, open_tasks
from tests.ops.live import APP_REF, Live, live_system
from tests.relay.helpers import Charged
from tests.saga.time_sagas import Loan, loan, participants
from tests.saga.versioned import V1, app_migrating
from tests.saga.versioned import Order as ShopOrder

pytestmark = pytest.mark.redis
runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
ORDER = '{"id":"o-json","customer":"c","lines":[],"total_cents":1}'


@dataclass(frozen=True, slots=True)
class World:
    """The live scenario, plus what the other commands need."""

    live: Live
    token: str
    outbox: str
    tasks: list[str]


async def _waiting_for_a_signal(url: str) -> str:
    """A loan saga waiting for its approval signal; the resume token it gave out."""
    redis = bus.connect(url)
    tokens: list[str] = []
    try:
        lending = App("lending", sagas=[loan], participants=participants([], tokens))
        clock = FakeClock()
        worker = SagaWorker(redis, lending, clock=clock, consumer="json-test")
        await SagaClient(redis, lending.registry, clock=clock).start(
            loan, Loan(id="L1", amount=1), saga_id="L1"
        )
        await worker.run_until_idle()
    finally:
        await redis.aclose()
    return tokens[0]


async def _versioned_sagas(url: str) -> None:
    redis = bus.connect(url)
    try:
        await SagaWorker(redis, app_migrating, consumer="json-test").register()
        await SagaClient(redis, app_migrating.registry).start(V1, ShopOrder(id="s1", total=5), saga_id="s1")
    finally:
        await redis.aclose()


def _outbox_with_a_failed_row(path: Path) -> str:
    dsn = f"sqlite:///{path}"
    anyio.run(relay.init_db, dsn)
    conn = sqlite3.connect(path)
    failed = relay.outbox.add(conn, "payments", Charged(order="o1"))
    relay.outbox.add(conn, "payments", Charged(order="o2"))
    conn.commit()
    conn.execute("UPDATE redsaga_outbox SET status = 2, error = 'NOPERM' WHERE id = ?", (failed,))
    conn.commit()
    conn.close()
    return dsn


@pytest.fixture
def world(real_redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("REDSAGA_SIGNAL_SECRET", raising=False)  # the secret generated in Redis
    with live_system(real_redis_url) as live:
        token = anyio.run(_waiting_for_a_signal, real_redis_url)
        anyio.run(_versioned_sagas, real_redis_url)
        tasks = anyio.run(_open_tasks, real_redis_url)
        yield World(live, token, _outbox_with_a_failed_row(tmp_path / "outbox.db"), tasks)


async def _open_tasks(url: str) -> list[str]:
    redis = bus.connect(url)
    try:
        return await open_tasks(redis, 500, 900)
    finally:
        await redis.aclose()


def _cases(world: World) -> dict[tuple[str, ...], list[str]]:
    """The arguments of each --json command, in the order they run (epoch accept last)."""
    ids = world.live.ids
    dsn = world.outbox
    schedule = ["--context", "orders"]
    keys = Path.cwd() / "keys"  # the test's own directory (the fixture changes into it)
    keys.mkdir(exist_ok=True)
    task, other = world.tasks
    acting = ["--authorizer", AUTHORIZER]
    return {
        ("acl",): ["--nopass"],
        ("start",): ["order_fulfilment", "--data", ORDER, "--id", "o-json"],
        ("inspect",): [ids["dead_lettered"]],
        ("list",): [],
        ("replay",): [ids["compensated"]],
        ("export",): [ids["completed"]],
        ("stats",): ["--dsn", dsn],
        ("dlq", "list"): [],
        ("dlq", "show"): [_first_letter(world)],
        ("dlq", "requeue"): ["--stream", "inbox"],
        ("dlq", "purge"): ["--all", "--yes"],
        ("force-complete",): [
            ids["dead_lettered"], "--step", "arrange_shipping", "--output", '{"tracking":"t"}',
            "--reason", "r",
        ],
        ("cancel",): [ids["running"], "--reason", "r"],
        ("retry",): [ids["dead_lettered_undo"]],
        ("signal",): [world.token, "--data", '{"approved": true, "by": "ann"}'],
        ("schedule", "create"): [
            "nightly", *schedule, "--saga", "order_fulfilment", "--cron", "@daily", "--data", ORDER,
        ],
        ("schedule", "list"): schedule,
        ("schedule", "pause"): ["nightly", *schedule],
        ("schedule", "resume"): ["nightly", *schedule],
        ("schedule", "trigger"): ["nightly", *schedule],
        ("versions", "check"): [],
        ("versions", "list"): [],
        ("versions", "migrate"): [
            "shop_order", "--from", "1", "--to", "2", "--dry-run",
            "--app", "tests.saga.versioned:app_migrating",
        ],
        ("relay", "init-db"): ["--dsn", dsn],
        ("relay", "stats"): ["--dsn", dsn],
        ("relay", "failed"): ["--dsn", dsn],
        ("relay", "requeue"): ["--all", "--dsn", dsn],
        ("relay",): ["--dsn", dsn, "--drain"],  # a subprocess: it configures logging
        ("demo",): ["--orders", "5"],  # a subprocess, on the embedded Redis
        ("keys", "generate"): ["--master", str(keys / "master.json")],  # before the other keys commands
        ("keys", "rotate"): ["--master", str(keys / "master.json"), "--kid", "k2"],
        ("keys", "list"): ["--master", str(keys / "master.json")],
        ("keys", "retire"): ["k2", "--master", str(keys / "master.json")],
        ("keys", "issue"): ["--master", str(keys / "master.json"), "--app", APP_REF, "--out", str(keys)],
        ("keda",): ["--app", APP_REF],
        ("functions", "load"): [],
        ("functions", "list"): [],
        ("functions", "prune"): ["--yes"],
        ("health", "relay"): ["--dsn", dsn],
        ("health", "worker"): ["--file", _fresh_health_file(keys / "health")],
        ("health", "ready"): ["--port", str(_ready_port())],
        ("tasks", "list"): ["--role", "managers"],
        ("tasks", "show"): [task],
        ("tasks", "claim"): [task, "--by", "ann", *acting],
        ("tasks", "release"): [task, "--by", "ann", *acting],
        ("tasks", "reassign"): [other, "--to", "user:ann", "--by", "lee", *acting],
        ("tasks", "complete"): [task, "--answer", '{"approved": true}', "--by", "ann", *acting],
        ("limits", "set"): ["payments", "--rate", "50/s", "--burst", "10", "--app", APP_REF],
        ("limits", "list"): ["--app", APP_REF],
        ("limits", "lines"): ["orders"],
        ("epoch", "show"): [],
        ("epoch", "accept"): ["--yes"],  # last: workers that see a new epoch stop
    }  # fmt: skip


SUBPROCESS = {("relay",): {}, ("demo",): {"REDSAGA_REDIS_URL": ""}}


def _fresh_health_file(path: Path) -> str:
    """A health file as a worker that just saw its Redis answer leaves it (the time, in ms)."""
    path.write_text(str(time.time_ns() // 1_000_000))
    return str(path)


def _ready_port() -> int:
    """The port of a metrics server whose worker is ready (on a loop of its own thread)."""
    from bus.metrics import MetricsServer

    ready: list[int] = []
    bound = threading.Event()

    async def nothing_wrong() -> list[str]:
        return []

    async def metrics() -> bytes:
        return b""

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            ready.append(await tg.start(MetricsServer(metrics, nothing_wrong).serve))
            bound.set()

    threading.Thread(target=anyio.run, args=(serve,), daemon=True).start()
    assert bound.wait(10)
    return ready[0]


def _first_letter(world: World) -> str:
    letters = msgspec.json.decode(runner.invoke(app, ["dlq", "list", "--json"], env=world.live.env).stdout)
    return str(letters[0]["id"])


def _json_commands() -> set[tuple[str, ...]]:
    found: set[tuple[str, ...]] = set()

    def walk(group: Any, prefix: tuple[str, ...]) -> None:
        if any("--json" in getattr(p, "opts", ()) for p in group.params):
            found.add(prefix)
        for name, command in getattr(group, "commands", {}).items():
            walk(command, (*prefix, name))

    walk(typer.main.get_command(app), ())
    return found


def _run(world: World, path: tuple[str, ...], args: list[str]) -> tuple[int, str, str]:
    command = [*path, *args, "--json"]
    if path in SUBPROCESS:
        done = subprocess.run(
            [sys.executable, "-m", "redsaga.cli", *command],
            env={**world.live.env, **SUBPROCESS[path]},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return done.returncode, done.stdout, done.stderr
    result = runner.invoke(app, command, env=world.live.env)
    structlog.reset_defaults()  # as a fresh process would start
    return result.exit_code, result.stdout, result.stderr


def test_every_json_command_prints_one_json_document(world: World) -> None:
    cases = _cases(world)
    assert set(cases) == _json_commands()  # a new --json command needs a case here
    for path, args in cases.items():
        if path == ("health", "worker"):  # fresh when it runs: the commands before it take a while
            _fresh_health_file(Path(args[1]))
        code, stdout, stderr = _run(world, path, args)
        assert code == 0, (path, stdout, stderr)
        document = msgspec.json.decode(stdout)  # raises on anything before or after it
        assert document is not None or path == ("signal",), path
        assert stdout.lstrip()[:1] in "{[", (path, stdout[:200])


def test_the_relay_subcommands_print_only_json_as_fresh_processes(tmp_path: Path) -> None:
    """The original report: structlog's default logger printed a line onto stdout first."""
    dsn = _outbox_with_a_failed_row(tmp_path / "outbox.db")
    for command in (["failed", "--json"], ["requeue", "--all", "--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "redsaga.cli", "relay", *command, "--dsn", dsn],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        msgspec.json.decode(done.stdout)
        assert "relay connected" not in done.stdout
