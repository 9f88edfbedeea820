"""What every ``saga`` command shares: the Redis URL and ``--json`` options, output, errors.

Commands are thin shells over the public Python clients: they parse options, call one
client method, and print a table (or JSON with ``--json``). Known errors become one line on
stderr and exit code 1; nothing is printed as a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, TypeVar

import anyio
import msgspec
import typer

import bus

T = TypeVar("T")

RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar=bus.URL_ENV,
        help="Redis URL (redis://, rediss:// for TLS). Default: an embedded in-memory server.",
        show_default=False,
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]


class CommandError(Exception):
    """A failure to report as one line and exit code 1 (bad input, unknown id, …)."""


def run(job: Callable[[], Awaitable[T]]) -> T:
    """Run an async job; known errors exit with code 1 and a one-line message."""
    try:
        return anyio.run(job)
    except (CommandError, bus.BusError, ValueError) as error:
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from error


def emit_json(value: Any) -> None:
    """Print ``value`` (Structs, dicts, lists) as indented JSON."""
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")


def emit_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a plain aligned table (bold headers on a terminal)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    typer.secho(line, bold=sys.stdout.isatty())
    for row in cells:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
