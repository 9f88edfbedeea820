"""The ``saga`` command: operations, workers, the relay and the demo."""

from __future__ import annotations

from collections.abc import Callable

import typer

from cli import _acl, _graph, _ops, _run, _time
from cli._common import reporting_errors
from cli._dlq import dlq_app
from cli._epoch import epoch_app
from cli._functions import functions_app
from cli._relay import relay_app
from cli._versions import versions_app

app = typer.Typer(
    name="saga",
    help="redsaga: durable sagas on Redis Streams. Every command takes --redis-url "
    "(env REDSAGA_REDIS_URL) and --json where it prints data; operations take --app "
    "(env REDSAGA_APP), the App whose sagas they operate. Exit codes: 0 done, 1 error or "
    "refused (one line on stderr, nothing changed), 2 bad usage, 3 action sent but not yet decided.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode="markdown",  # docstring paragraphs are reflowed, not broken where the source wraps
)
for command in (_run.worker, _run.demo, _graph.graph, _time.signal, _acl.acl):
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
app.add_typer(functions_app, name="functions")
app.add_typer(relay_app, name="relay")
app.add_typer(versions_app, name="versions")
app.add_typer(_time.schedule_app, name="schedule")


def main() -> None:
    """Console-script entry point."""
    app()
