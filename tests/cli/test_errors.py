"""Errors as a user meets them: one line on stderr and an exit code, never a traceback.

Exit code 1: the command failed or was refused (a missing file, a database or Redis that
does not answer). Exit code 2: bad usage (an option that does not parse, no Redis URL).
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from psycopg import conninfo
from typer.testing import CliRunner, Result

from redsaga.cli._common import reporting_errors
from redsaga.cli.main import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
CLOSED_REDIS = "redis://127.0.0.1:1/0"
NO_REDIS = {"REDSAGA_REDIS_URL": "", "REDSAGA_APP": "", "REDSAGA_RELAY_DSN": "", "REDSAGA_PG_DSN": ""}
RELAY_COMMANDS = [
    ["relay", "--drain", "--redis-url", CLOSED_REDIS],
    ["relay", "init-db"],
    ["relay", "stats"],
    ["relay", "failed"],
    ["relay", "requeue", "--all"],
]


def saga(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, list(args), env={**NO_REDIS, **(env or {})})


def one_line_error(result: Result, code: int, *expected: str) -> str:
    """Assert exit ``code`` and one ``error:`` line on stderr holding each of ``expected``."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    line = result.stderr
    assert line.startswith("error: "), line
    assert len(line.splitlines()) == 1, line
    assert "Traceback" not in result.output
    for text in expected:
        assert text in line, line
    return line


# -- the relay's subcommands ------------------------------------------------------------------


@pytest.mark.parametrize("command", RELAY_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_missing_sqlite_file(command: list[str], tmp_path: Path) -> None:
    # init-db creates a missing file, but not a missing directory
    dsn = f"sqlite:///{tmp_path / 'no-such-dir' / 'outbox.db'}"
    result = saga(*command, "--dsn", dsn)
    one_line_error(result, 1, "SQLite")


@pytest.mark.parametrize("command", RELAY_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_an_unsupported_dsn_scheme(command: list[str]) -> None:
    result = saga(*command, "--dsn", "mysql://app:hunter2hunter2@db/payments")
    line = one_line_error(result, 2, "mysql: is not supported", "'mysql://app:***@db/payments'")
    assert "hunter2hunter2" not in line


@pytest.mark.parametrize("command", RELAY_COMMANDS[1:], ids=lambda c: " ".join(c[:2]))
def test_postgresql_down(command: list[str]) -> None:
    result = saga(*command, "--dsn", "postgresql://app:hunter2hunter2@127.0.0.1:1/payments")
    line = one_line_error(result, 1, "PostgreSQL unavailable", "Connection refused")
    assert "hunter2hunter2" not in line


@pytest.mark.postgres
@pytest.mark.parametrize("command", RELAY_COMMANDS[1:], ids=lambda c: " ".join(c[:2]))
def test_a_missing_postgresql_database(command: list[str], pg_dsn: str) -> None:
    """A database that does not exist on the session's server (nothing is created)."""
    missing = f"redsaga_missing_{secrets.token_hex(4)}"
    dsn = conninfo.make_conninfo(pg_dsn, dbname=missing)  # a keyword DSN
    one_line_error(saga(*command, "--dsn", dsn), 1, f'database "{missing}" does not exist')


@pytest.mark.parametrize("command", RELAY_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_a_bad_table_name(command: list[str], tmp_path: Path) -> None:
    result = saga(*command, "--dsn", f"sqlite:///{tmp_path / 'outbox.db'}", "--tables", "bad-name")
    one_line_error(result, 2, "Invalid value for '--tables'", "must be a plain identifier")


@pytest.mark.parametrize("command", RELAY_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_no_dsn(command: list[str]) -> None:
    one_line_error(saga(*command), 2, "no outbox database given: pass --dsn DSN or set REDSAGA_RELAY_DSN")


def test_the_relay_needs_a_redis_url(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'outbox.db'}"
    assert saga("relay", "init-db", "--dsn", dsn).exit_code == 0
    one_line_error(saga("relay", "--drain", "--dsn", dsn), 2, "REDSAGA_REDIS_URL")


# -- Redis that does not answer, and no Redis at all ---------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["epoch", "show"],
        ["epoch", "accept", "--yes"],
        ["schedule", "list", "--context", "orders"],
        ["ui", "--port", "0"],
        ["tasks", "list", "--role", "managers"],
        ["tasks", "show", "refunds:0:t"],
        ["tasks", "claim", "refunds:0:t", "--by", "ann", "--authorizer", "tests.cli.task_world:authorize"],
    ],
    ids=" ".join,
)
def test_redis_down(command: list[str]) -> None:
    one_line_error(saga(*command, "--redis-url", CLOSED_REDIS), 1, "Redis unavailable")


def test_the_demo_reports_redis_down_at_once_instead_of_waiting() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "redsaga.cli", "demo", "--orders", "5", "--redis-url", CLOSED_REDIS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.startswith("error: Redis unavailable")
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stdout == ""


NEEDS_REDIS = [
    [
        "schedule",
        "create",
        "nightly",
        "--context",
        "orders",
        "--saga",
        "order_fulfilment",
        "--cron",
        "@daily",
    ],
    ["epoch", "accept", "--yes"],
    ["epoch", "show"],
    ["signal", "rs1.x.y"],
    ["worker", "--app", "redsaga.examples.orders:app"],
    ["relay", "--dsn", "sqlite:///unused.db"],
    ["versions", "list"],
    ["list", "--app", "tests.ops.scenario:app"],
    ["ui"],
    ["tasks", "list", "--role", "managers"],
    ["tasks", "show", "refunds:0:t"],
    ["tasks", "claim", "refunds:0:t", "--by", "ann", "--authorizer", "tests.cli.task_world:authorize"],
    ["tasks", "release", "refunds:0:t", "--by", "ann", "--authorizer", "tests.cli.task_world:authorize"],
    [
        "tasks",
        "complete",
        "t",
        "--answer",
        "{}",
        "--by",
        "ann",
        "--authorizer",
        "tests.cli.task_world:authorize",
    ],
    [
        "tasks",
        "reassign",
        "t",
        "--to",
        "user:x",
        "--by",
        "ann",
        "--authorizer",
        "tests.cli.task_world:authorize",
    ],
]


@pytest.mark.parametrize("command", NEEDS_REDIS, ids=lambda c: " ".join(c[:2]))
def test_without_a_redis_url_only_the_demo_runs(command: list[str]) -> None:
    """No silent throw-away in-memory Redis that reports success: only saga demo uses one."""
    one_line_error(saga(*command), 2, "no Redis to use: pass --redis-url URL or set REDSAGA_REDIS_URL")


# -- usage errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["list", "--stuck-for", "10x"], "Invalid value for '--stuck-for': '10x' is not a duration"),
        (["stats", "--stuck-for", "soon"], "Invalid value for '--stuck-for': 'soon' is not a duration"),
        (["signal", "rs1.x.y", "--data", "[1,"], "Invalid value for '--data': not JSON"),
        (["worker", "--app", "redsaga.examples.orders:app", "--log-level", "loud"], "'--log-level'"),
        (["acl", "--app", "redsaga.examples.all:app"], "give exactly one of --password-env VAR and --nopass"),
        (["relay", "--dsn", "sqlite:///x.db", "--batch-size", "0"], "Invalid value for '--batch-size'"),
        (["relay", "--dsn", "sqlite:///x.db", "--poll-interval", "0"], "poll_interval_s must be positive"),
        (["relay", "requeue", "--dsn", "sqlite:///x.db"], "give the ids of failed rows, or --all"),
        (["relay", "ddl", "--tables", "bad-name"], "Invalid value for '--tables'"),
        (["epoch", "accept", "--redis-url", CLOSED_REDIS], "accepting a new epoch needs --yes"),
        (["list", "--no-such-option"], "No such option: --no-such-option (see saga list --help)"),
        (["worker"], "Missing option '--app'"),
        (["worker", "--app", "redsaga.examples.orders:app", "--partitions", "3-1"], "'--partitions': '3-1'"),
        (
            ["worker", "--app", "redsaga.examples.orders:app", "--partitions", "0,2-3"],
            "Invalid value for '--partitions': no partition 2,3 to serve: 'orders' has 1; give indexes",
        ),
        (["dlq", "nonsense"], "No such command 'nonsense'"),
        (["ui", "--port", "70000"], "Invalid value for '--port'"),
        (["tasks", "list", "--role", "r", "--user", "u"], "give at most one of --role ROLE and --user USER"),
        (["tasks", "claim", "t", "--by", "ann"], "needs the application's authorizer: pass --authorizer"),
        (
            ["tasks", "complete", "t", "--by", "a", "--answer", "[1,"],
            "Invalid value for '--answer': not JSON",
        ),
        (["tasks", "reassign", "t", "--by", "a", "--to", "team:x"], "is not role:NAME or user:NAME"),
        (["tasks", "release", "t"], "Missing option '--by'"),
        (
            ["list", "--redis-url", "http://x"],
            "the Redis URL's scheme 'http' is not one of redis://, rediss://",
        ),
        (["health", "ready"], "no port given: pass --port (or set REDSAGA_METRICS_PORT)"),
        (
            ["schedule", "create", "s1", "--saga", "x", "--context", "orders", "--cron", "61 2 * * *"],
            "cron '61 2 * * *': the minute field '61' is not valid (0-59)",
        ),
        (["relay", "stats", "--dsn", "bogus"], "Invalid value for '--dsn': cannot open 'bogus'"),
    ],
    ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else None,
)
def test_usage_errors_are_one_line_and_exit_2(command: list[str], expected: str) -> None:
    one_line_error(saga(*command, env={"REDSAGA_REDIS_URL": CLOSED_REDIS}), 2, expected)


def test_no_arguments_prints_the_help() -> None:
    result = saga()
    assert result.exit_code == 2
    assert "Usage: saga" in result.stdout


def test_saga_version() -> None:
    from importlib.metadata import version

    result = saga("--version")
    assert result.exit_code == 0
    assert result.stdout == f"redsaga {version('redsaga')}\n"


# -- the same options everywhere -----------------------------------------------------------------


def _commands(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found.append(((*prefix, name), command))  # a group with a callback of its own
            found += _commands(command, (*prefix, name))
        else:
            found.append(((*prefix, name), command))
    return found


COMMANDS = _commands(typer.main.get_command(app))
REDIS_FREE = {
    ("acl",),
    ("keys",),
    ("keda",),
    ("functions",),
    ("health",),
    ("health", "worker"),
    ("health", "relay"),
    ("health", "ready"),  # it asks the worker's port, not Redis
    ("keys", "generate"),
    ("keys", "rotate"),
    ("keys", "retire"),
    ("keys", "list"),
    ("keys", "issue"),
    ("graph",),
    ("dlq",),
    ("epoch",),
    ("limits",),
    ("tasks",),
    ("schedule",),
    ("versions",),
    ("relay", "init-db"),
    ("relay", "ddl"),
    ("relay", "stats"),
    ("relay", "failed"),
    ("relay", "requeue"),
}
"""Commands (and groups) that never talk to Redis."""


def _option(command: Any, name: str) -> Any:
    return next((p for p in command.params if name in getattr(p, "opts", ())), None)


def test_every_command_that_uses_redis_takes_redis_url_from_the_environment() -> None:
    for path, command in COMMANDS:
        option = _option(command, "--redis-url")
        if path in REDIS_FREE:
            assert option is None, path
            continue
        assert option is not None, f"saga {' '.join(path)} has no --redis-url"
        assert option.envvar == "REDSAGA_REDIS_URL", path


def test_every_app_option_reads_redsaga_app() -> None:
    with_app = [(path, _option(command, "--app")) for path, command in COMMANDS]
    with_app = [(path, option) for path, option in with_app if option is not None]
    assert len(with_app) >= 15
    for path, option in with_app:
        assert option.envvar == "REDSAGA_APP", f"saga {' '.join(path)} --app does not read REDSAGA_APP"


def test_redsaga_app_stands_in_for_app() -> None:
    result = runner.invoke(app, ["acl", "--nopass"], env={"REDSAGA_APP": "redsaga.examples.all:app"})
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ACL SETUSER")


def test_every_command_reports_errors_on_one_line() -> None:
    """Each command (and the relay group, which runs the relay itself) is wrapped by
    reporting_errors: a known error can never come out as a traceback."""
    wrapper = reporting_errors(lambda: None).__code__

    def wrapped(callback: Any) -> bool:
        while callback is not None:  # typer wraps the callback it was given in its own
            if callback.__code__ is wrapper:
                return True
            callback = getattr(callback, "__wrapped__", None)
        return False

    for path, command in COMMANDS:
        groups = {(), ("dlq",), ("epoch",), ("schedule",), ("tasks",), ("versions",)}
        if command.callback is None or path in groups:
            continue
        assert wrapped(command.callback), f"saga {' '.join(path)} is not wrapped"
