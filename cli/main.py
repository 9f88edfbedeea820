"""The ``saga`` command: operations, workers, the relay and the demo."""

from __future__ import annotations

import typer

from cli import _graph, _run, _time
from cli._common import reporting_errors
from cli._relay import relay_app

app = typer.Typer(
    name="saga",
    help="redsaga: durable sagas on Redis Streams. Every command takes --redis-url "
    "(env REDSAGA_REDIS_URL) and --json where it prints data.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
for command in (_run.worker, _run.demo, _graph.graph, _time.signal):
    app.command()(reporting_errors(command))

app.add_typer(relay_app, name="relay")
app.add_typer(_time.schedule_app, name="schedule")


def main() -> None:
    """Console-script entry point."""
    app()
