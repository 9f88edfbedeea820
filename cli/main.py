"""The ``saga`` command: operations, workers, the relay and the demo."""

from __future__ import annotations

import typer

from cli._relay import relay_app

app = typer.Typer(
    name="saga",
    help="redsaga: durable sagas on Redis Streams. Every command takes --redis-url "
    "(env REDSAGA_REDIS_URL) and --json.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

app.add_typer(relay_app, name="relay")


def main() -> None:
    """Console-script entry point."""
    app()
