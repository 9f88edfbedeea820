"""What every ``saga`` command shares: the Redis URL and ``--json`` options, output, errors.

Commands are thin shells over the public Python clients: they parse options, call one
client method, and print a table (or JSON with ``--json``). Known errors become one line on
stderr and exit code 1; nothing is printed as a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, ParamSpec, TypeVar

import anyio
import msgspec
import typer

import bus
from saga import SagaError

T = TypeVar("T")
P = ParamSpec("P")

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


KNOWN_ERRORS: tuple[type[Exception], ...] = (CommandError, bus.BusError, SagaError, ValueError, KeyError)


def run(job: Callable[[], Awaitable[T]]) -> T:
    """Run an async job (errors are reported by :func:`reporting_errors`)."""
    return anyio.run(job)


def with_redis(redis_url: str | None, job: Callable[[bus.Redis], Awaitable[T]]) -> T:
    """Connect to ``redis_url``, run ``job(redis)``, close the connection; return its result."""

    async def main() -> T:
        redis = bus.connect(redis_url)
        try:
            return await job(redis)
        finally:
            await redis.aclose()

    return run(main)


def reporting_errors(command: Callable[P, None]) -> Callable[P, None]:
    """Wrap a command so known errors print one line on stderr and exit with code 1."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except KNOWN_ERRORS as error:
            _report(error)
            raise typer.Exit(1) from error
        except BaseExceptionGroup as group:  # a worker's task group: report each known error
            known, rest = group.split(KNOWN_ERRORS)
            if known is None or rest is not None:
                raise
            for leaf in _leaves(known):
                _report(leaf)
            raise typer.Exit(1) from group

    return wrapper


def _report(error: BaseException) -> None:
    message = error.args[0] if isinstance(error, KeyError) and error.args else error
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    return [
        leaf
        for error in group.exceptions
        for leaf in (_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    ]


def emit_json(value: Any) -> None:
    """Print ``value`` (Structs, dicts, lists) as indented JSON."""
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")


def emit_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    colours: Mapping[int, Callable[[str], str | None]] | None = None,
) -> None:
    """Print an aligned table with bold headers.

    Cells of the ``colours`` columns are coloured by their value; click strips the styles
    when stdout is not a terminal.
    """
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    typer.secho(line.rstrip(), bold=True)
    colours = colours or {}
    for row in cells:
        out = []
        for index, (cell, width) in enumerate(zip(row, widths, strict=True)):
            padded = cell.ljust(width)
            colour = colours[index](cell) if index in colours else None
            out.append(typer.style(padded, fg=colour) if colour else padded)
        typer.echo("  ".join(out).rstrip())
