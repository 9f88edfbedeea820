"""``saga keys issue --out DIR`` writes one keyring file per process into DIR, creating it."""

from __future__ import annotations

import stat
from pathlib import Path

import msgspec
from typer.testing import CliRunner

from bus._auth import load_keyrings
from redsaga.cli.main import app

runner = CliRunner()
APP_REF = "redsaga.examples.all:app"


def test_keys_issue_creates_the_directory_it_writes_to(tmp_path: Path) -> None:
    master = tmp_path / "master.json"
    assert runner.invoke(app, ["keys", "generate", "--master", str(master)]).exit_code == 0
    out = tmp_path / "keyrings" / "prod"
    issued = runner.invoke(
        app, ["keys", "issue", "--master", str(master), "--app", APP_REF, "--out", str(out)]
    )
    assert issued.exit_code == 0, issued.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert (out / "orchestrator.orders.keyring.json").exists()
    not_a_directory = runner.invoke(
        app, ["keys", "issue", "--master", str(master), "--app", APP_REF, "--out", str(master)]
    )
    assert not_a_directory.exit_code == 2
    assert "is not a directory" in not_a_directory.stderr


def test_keys_issue_for_an_orchestrator_holds_its_task_inbox_too(tmp_path: Path) -> None:
    """As the default per-process file does: the task inbox runs in the orchestrator's worker."""
    master = tmp_path / "master.json"
    assert runner.invoke(app, ["keys", "generate", "--master", str(master)]).exit_code == 0
    out = tmp_path / "orders.keyring.json"
    args = ["keys", "issue", "--master", str(master), "--app", APP_REF, "-p", "orchestrator:orders"]
    issued = runner.invoke(app, [*args, "--out", str(out), "--json"])
    assert issued.exit_code == 0, issued.output
    [written] = msgspec.json.decode(issued.stdout)["written"]
    assert written["principals"] == ["orchestrator:orders", "participant:tasks"]
    assert {k.principal for k in load_keyrings(out)} == {"orchestrator:orders", "participant:tasks"}


def test_keys_issue_names_a_client_or_operator_either_way_and_ignores_none(tmp_path: Path) -> None:
    master = tmp_path / "master.json"
    assert runner.invoke(app, ["keys", "generate", "--master", str(master)]).exit_code == 0
    base = ["keys", "issue", "--master", str(master), "--app", APP_REF, "--json"]
    alone = runner.invoke(app, [*base, "-p", "client:web", "--out", str(tmp_path / "web.json")])
    assert alone.exit_code == 0, alone.output
    assert msgspec.json.decode(alone.stdout)["written"][0]["principals"] == ["client:web"]
    both = runner.invoke(
        app, [*base, "-p", "client:web", "--operator", "oncall", "--out", str(tmp_path / "both.json")]
    )
    assert both.exit_code == 0, both.output
    assert msgspec.json.decode(both.stdout)["written"][0]["principals"] == ["client:web", "operator:oncall"]
