"""``saga demo``, ``graph``, ``worker`` and ``epoch`` end to end (typer's runner, real subprocesses)."""

from __future__ import annotations

import gc
import subprocess
import sys

import msgspec
import pytest
import redis as redis_sync
import typer
from typer.testing import CliRunner

import bus
from redsaga.cli.main import app
from saga import EngineConfig
from saga.runtime.gc_tuning import YOUNG_THRESHOLD

runner = CliRunner()
UNUSED = "redis://127.0.0.1:1/0"
"""A Redis URL for commands whose connection the test replaces."""


def test_demo_on_embedded_redis_ends_every_saga_and_balances_the_books() -> None:
    result = runner.invoke(
        app, ["demo", "--orders", "40", "--seed", "3", "--json"], env={"REDSAGA_REDIS_URL": ""}
    )
    assert result.exit_code == 0, result.output
    report = msgspec.json.decode(result.stdout)
    assert report["unfinished"] == 0
    assert report["ledger_balanced"] is True
    assert report["stock_released"] is True
    outcomes = {o["status"]: o["sagas"] for o in report["outcomes"]}
    assert sum(outcomes.values()) == 40
    assert set(outcomes) == {"completed", "compensated"}
    # the large orders waited for a manager: one let run overdue, escalated once, then approved
    approvals = report["approvals"]
    late = [a for a in approvals if a["escalated"]]
    assert len(late) == 1
    assert late[0]["actions"] == [
        "opened by engine",
        "escalation: reassigned by engine",
        "escalation: extended by engine",
        "claimed by sam",
        "completed by sam",
    ]
    on_time = [a for a in approvals if not a["escalated"]]
    assert on_time
    assert all(a["actions"] == ["opened by engine", "claimed by ann", "completed by ann"] for a in on_time)
    assert max(o["p99_ms"] for o in report["outcomes"]) < 60_000  # the skipped hours are left out


@pytest.mark.redis
def test_demo_on_real_redis_as_a_subprocess(real_redis_url: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "redsaga.cli", "demo", "--orders", "30", "--redis-url", real_redis_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "30 orders in" in completed.stdout
    assert "ledger balanced: yes" in completed.stdout
    assert "waited for a manager;" in completed.stdout
    assert "approved on time by ann" in completed.stdout
    assert "escalated to senior-managers, approved by sam" in completed.stdout


def test_graph_prints_the_definition_as_mermaid_and_dot() -> None:
    mermaid = runner.invoke(app, ["graph", "redsaga.examples.orders:order_fulfilment"])
    assert mermaid.exit_code == 0
    assert "reserve_stock -.->|compensate| undo_reserve_stock" in mermaid.stdout
    assert "undo_charge_payment -.->|then| undo_reserve_stock" in mermaid.stdout
    dot = runner.invoke(app, ["graph", "redsaga.examples.orders:order_fulfilment", "--format", "dot"])
    assert dot.stdout.startswith('digraph "order_fulfilment@1"')


def test_graph_of_the_lifecycle_lists_every_transition() -> None:
    from saga.core.states import SAGA_TRANSITIONS

    result = runner.invoke(app, ["graph", "lifecycle"])
    edges = sum(len(t) for t in SAGA_TRANSITIONS.values())
    assert result.stdout.count("-->") == edges + 1 + sum(1 for t in SAGA_TRANSITIONS.values() if not t)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["graph", "nope:x"], "cannot import 'nope'"),
        (["graph", "redsaga.examples.orders"], "is not 'module:attribute'"),
        (["graph", "redsaga.examples.orders:missing"], "has no attribute 'missing'"),
        (["worker", "--app", "nope:x", "--redis-url", "redis://127.0.0.1:1/0"], "cannot import 'nope'"),
    ],
)
def test_bad_references_are_one_line_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "signing is off: this worker would act on entries nobody checked"),
        ({"REDSAGA_VERIFY": "log"}, "verification mode 'log' needs a keyring"),
        (
            {"REDSAGA_KEYRING": "/nonexistent/keyring.json"},
            "cannot read the keyring /nonexistent/keyring.json",
        ),
        ({"REDSAGA_KEYRING": '{"redsaga_keyring": 1}'}, "the keyring is not valid"),
    ],
    ids=["no-keyring", "log-without-keyring", "missing-file", "bad-keyring"],
)
def test_a_worker_without_a_usable_keyring_refuses_to_start(env: dict[str, str], message: str) -> None:
    args = ["worker", "--app", "redsaga.examples.all:app", "--redis-url", "redis://127.0.0.1:1/0"]
    result = runner.invoke(app, args, env={"REDSAGA_KEYRING": "", "REDSAGA_VERIFY": "", **env})
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_known_errors_from_a_task_group_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from redsaga.cli._common import reporting_errors

    @reporting_errors
    def worker() -> None:
        denied = bus.RedisPermissionDenied("Redis refused: no permission on rs:{orders:0}:inbox")
        raise ExceptionGroup("unhandled errors in a TaskGroup", [ExceptionGroup("inner", [denied])])

    @reporting_errors
    def crashed() -> None:
        raise ExceptionGroup("unhandled errors in a TaskGroup", [bus.GroupExists("x"), RuntimeError("bug")])

    with pytest.raises(typer.Exit) as exited:
        worker()
    assert exited.value.exit_code == 1
    assert capsys.readouterr().err == "error: Redis refused: no permission on rs:{orders:0}:inbox\n"
    with pytest.raises(ExceptionGroup):  # an unknown error keeps its traceback
        crashed()


def test_the_worker_tunes_the_collector_before_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up heap is frozen (full collections need not walk it) and young collections
    are rarer; the older generations keep their ratios."""
    seen: list[tuple[int, tuple[int, int, int]]] = []

    def run(_main: object) -> None:
        seen.append((gc.get_freeze_count(), gc.get_threshold()))

    monkeypatch.setattr("redsaga.cli._run.run", run)
    gc.unfreeze()
    threshold = gc.get_threshold()
    try:
        args = ["worker", "--app", "redsaga.examples.orders:app", "--redis-url", UNUSED]
        result = runner.invoke(app, args, env={"REDSAGA_VERIFY": "off"})
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert result.exit_code == 0, result.output
    [(frozen, (young, older, oldest))] = seen
    assert frozen > 1000
    assert (young, older, oldest) == (YOUNG_THRESHOLD, threshold[1], threshold[2])


def test_the_worker_runs_with_the_librarys_defaults_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """``saga worker`` takes its slot and lease defaults from ``BusConfig``, so the two
    cannot drift apart; its options override them."""
    seen: list[bus.BusConfig] = []
    served: list[tuple[int, ...]] = []

    def config(*, bus: bus.BusConfig, auth: bus.Authenticator, partitions: tuple[int, ...]) -> EngineConfig:
        seen.append(bus)
        served.append(partitions)
        return EngineConfig(bus=bus, auth=auth, partitions=partitions)

    monkeypatch.setattr("redsaga.cli._run.EngineConfig", config)
    monkeypatch.setattr("redsaga.cli._run.run", lambda _main: None)
    monkeypatch.setattr("redsaga.cli._run.tune_gc", lambda: None)
    for args in ([], ["--concurrency", "8", "--lease-ms", "5000", "--partitions", "0-1,3"]):
        result = runner.invoke(
            app,
            ["worker", "--app", "tests.saga.test_partition_subset:APP", "--redis-url", UNUSED, *args],
            env={"REDSAGA_VERIFY": "off"},
        )
        assert result.exit_code == 0, result.output
    assert seen == [bus.BusConfig(), bus.BusConfig(concurrency=8, lease_ms=5000)]
    assert served == [(), (0, 1, 3)]  # every partition unless told


@pytest.mark.redis
def test_the_epoch_commands_speak_plainly(real_redis_url: str) -> None:
    """``saga epoch show|accept`` as an operator reads them: none yet, an id, a loss seen."""
    redis = redis_sync.Redis.from_url(real_redis_url)
    redis.delete("rs:epoch")
    try:
        shown = runner.invoke(app, ["epoch", "show", "--redis-url", real_redis_url])
        assert shown.stdout == "no epoch yet: the first worker to start creates one\n"
        refused = runner.invoke(app, ["epoch", "accept", "--redis-url", real_redis_url])
        assert refused.exit_code != 0
        assert "accepting a new epoch needs --yes" in refused.output
        accepted = runner.invoke(app, ["epoch", "accept", "--yes", "--redis-url", real_redis_url])
        epoch = accepted.stdout.split()[2].rstrip(":")
        assert accepted.stdout == f"new epoch {epoch}: start the workers again\n"
        assert runner.invoke(app, ["epoch", "show", "--redis-url", real_redis_url]).stdout == f"{epoch}\n"
        redis.set("rs:epoch", f"lost:{epoch}")
        lost = runner.invoke(app, ["epoch", "show", "--redis-url", real_redis_url]).stdout
        assert lost == f"lost:{epoch}  (data loss seen: workers refuse to start; see saga epoch accept)\n"
    finally:
        redis.delete("rs:epoch")
        redis.close()
