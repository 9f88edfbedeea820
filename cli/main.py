"""The ``saga`` command: operations, workers, the relay and the demo."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version as installed_version
from typing import Annotated

import typer

from redsaga.cli import _acl, _graph, _keda, _ops, _run, _time, _ui
from redsaga.cli._common import CommandGroup, emit_line, reporting_errors
from redsaga.cli._dlq import dlq_app
from redsaga.cli._epoch import epoch_app
from redsaga.cli._functions import functions_app
from redsaga.cli._health import health_app
from redsaga.cli._keys import keys_app
from redsaga.cli._limits import limits_app
from redsaga.cli._relay import relay_app
from redsaga.cli._tasks import tasks_app
from redsaga.cli._versions import versions_app

app = typer.Typer(
    name="saga",
    cls=CommandGroup,
    help="redsaga: durable sagas on Redis Streams. Every command that uses Redis takes --redis-url "
    "(env REDSAGA_REDIS_URL; only saga demo runs without one), every command that prints data "
    "takes --json, and every --app option reads REDSAGA_APP. Exit codes: 0 done, 1 error or "
    "refused (one line on stderr, nothing changed), 2 bad usage (one line on stderr), 3 action "
    "sent but not yet decided.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="markdown",  # docstring paragraphs are reflowed, not broken where the source wraps
)


def _print_version(asked: bool) -> None:
    if asked:
        emit_line(f"redsaga {installed_version('redsaga')}")
        raise typer.Exit


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the installed version and exit."
        ),
    ] = False,
) -> None:
    """Options of the ``saga`` command itself."""


for command in (_run.worker, _run.demo, _graph.graph, _time.signal, _acl.acl, _keda.keda, _ui.ui):
    app.command()(reporting_errors(command))
operations: tuple[tuple[str, Callable[..., None]], ...] = (
    ("start", _ops.start),
    ("inspect", _ops.inspect),
    ("list", _ops.list_sagas),
    ("replay", _ops.replay),
    ("force-complete", _ops.force_complete),
    ("cancel", _ops.cancel),
    ("retry", _ops.retry),
    ("export", _ops.export),
    ("stats", _ops.stats),
)
for name, operation in operations:
    app.command(name)(reporting_errors(operation))

app.add_typer(dlq_app, name="dlq")
app.add_typer(epoch_app, name="epoch")
app.add_typer(health_app, name="health")
app.add_typer(keys_app, name="keys")
app.add_typer(limits_app, name="limits")
app.add_typer(functions_app, name="functions")
app.add_typer(relay_app, name="relay")
app.add_typer(tasks_app, name="tasks")
app.add_typer(versions_app, name="versions")
app.add_typer(_time.schedule_app, name="schedule")


def main() -> None:
    """Console-script entry point."""
    app()
