"""What every ``saga`` command shares: options, the Redis connection, output and errors.

Commands are thin shells over the public Python clients: they parse options, call one
client method, and print a table (or JSON with ``--json``). Every line a human reads goes
through :func:`emit_line` or :func:`emit_table`, which escape control characters in the
values (see :func:`redsaga.cli._format.printable`). Errors are one line on stderr, never a
traceback: exit code 1 when the command failed or was refused, 2 for bad usage (an unknown
option, a value that does not parse, no Redis URL).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Final, ParamSpec, TypeVar

import anyio
import msgspec
import typer
import typer.core
from rich.console import Console
from rich.table import Table
from rich.text import Text

# typer vendors click: its usage errors are these classes (pyproject pins a typer that does).
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

import bus
import relay
from bus.lowlevel import redis_errors
from redsaga.cli._format import cell
from saga import SagaError
from saga.ops.text import printable

T = TypeVar("T")
P = ParamSpec("P")

APP_ENV = "REDSAGA_APP"
"""The environment variable every ``--app`` option reads."""

RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar=bus.URL_ENV,
        help="The Redis to use (redis://, or rediss:// for TLS). Required: only saga demo runs on "
        "an embedded one.",
        show_default=False,
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]


def app_option(help_text: str) -> Any:
    """An ``--app module:attribute`` option that ``$REDSAGA_APP`` fills in."""
    return typer.Option("--app", envvar=APP_ENV, help=help_text, show_default=False, metavar="MODULE:ATTR")


_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


class CommandError(Exception):
    """A failure to report as one line and exit code 1 (bad input, unknown id, …)."""

    exit_code: int = 1


class UsageProblem(CommandError):
    """Bad usage found by a command itself (a missing setting): one line, exit code 2."""

    exit_code = 2


KNOWN_ERRORS: tuple[type[Exception], ...] = (
    CommandError,
    bus.BusError,
    SagaError,
    relay.RelayError,
    ValueError,
    KeyError,
)


def run(job: Callable[[], Awaitable[T]]) -> T:
    """Run an async job (errors are reported by :func:`reporting_errors`)."""
    return anyio.run(job)


def real_redis_url(url: str | None) -> str:
    """``url`` or ``$REDSAGA_REDIS_URL``; a usage error when neither names a real Redis."""
    resolved = bus.resolve_url(url)
    if resolved.startswith(bus.MEMORY_URL):
        raise UsageProblem(
            f"no Redis to use: pass --redis-url URL or set {bus.URL_ENV} "
            "(only saga demo runs on an embedded Redis)"
        )
    scheme = resolved.partition("://")[0] if "://" in resolved else ""
    if scheme not in _REDIS_SCHEMES:  # the URL itself may hold a password: name its scheme only
        raise UsageProblem(
            f"the Redis URL's scheme {scheme!r} is not one of {', '.join(s + '://' for s in _REDIS_SCHEMES)}"
        )
    return resolved


def with_redis(redis_url: str | None, job: Callable[[bus.Redis], Awaitable[T]]) -> T:
    """Connect to the real Redis ``redis_url`` names, run ``job(redis)``, close; return its result.

    Redis errors become the bus's typed errors (``Redis unavailable: …``), reported as one line.
    """
    url = real_redis_url(redis_url)

    async def main() -> T:
        redis = bus.connect(url)
        try:
            with redis_errors():
                return await job(redis)
        finally:
            await redis.aclose()

    return run(main)


def reporting_errors(command: Callable[P, None]) -> Callable[P, None]:
    """Wrap a command so known errors print one line on stderr and exit with their code."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except KNOWN_ERRORS as error:
            _report(error)
            raise typer.Exit(getattr(error, "exit_code", 1)) from error
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
    emit_line(f"error: {message}", fg=typer.colors.RED, err=True)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    return [
        leaf
        for error in group.exceptions
        for leaf in (_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    ]


class CommandGroup(typer.core.TyperGroup):
    """The ``saga`` group: a usage error is one line on stderr too, exit code 2."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; exit with its code (usage errors reported on one line)."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)  # noqa: FBT003
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)  # noqa: FBT003
        except NoArgsIsHelpError as error:  # the help has been printed
            sys.exit(error.exit_code)
        except ClickException as error:
            _report_usage(error)
            sys.exit(error.exit_code)
        except typer.Abort:
            emit_line("error: aborted", fg=typer.colors.RED, err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _report_usage(error: ClickException) -> None:
    message = error.format_message().rstrip(".")
    if isinstance(error, UsageError) and error.ctx is not None:
        message += f" (see {error.ctx.command_path} --help)"
    emit_line(f"error: {message}", fg=typer.colors.RED, err=True)


# -- output ----------------------------------------------------------------------------------------


def emit_json(value: Any) -> None:
    """Print ``value`` (Structs, dicts, lists) as one indented JSON document."""
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode() + "\n")


def emit_line(
    text: str = "",
    *,
    prefix: str = "",
    fg: str | None = None,
    bold: bool = False,
    underline: bool = False,
    err: bool = False,
) -> None:
    """Print one line: ``prefix`` plain, then ``text`` styled; control characters escaped.

    Styles are left out when the stream is not a terminal.
    """
    shown = printable(text)
    if fg or bold or underline:
        shown = typer.style(shown, fg=fg, bold=bold or None, underline=underline or None)
    typer.echo(printable(prefix) + shown, err=err)


def emit_text(text: str) -> None:
    """Print a document of several lines (a diagram): each line escaped, its line breaks kept."""
    for line in text.removesuffix("\n").split("\n"):
        emit_line(line)


WHOLE_COLUMN = 20
"""On a terminal, columns no wider than this (times, statuses, counts) are never wrapped."""
NARROWEST_WRAP = 10
"""The narrowest a wrapped column gets on a narrow terminal."""
_GAP = 2


EMPTY: Final = "(none)"
"""The line under the headers of an empty table."""


def emit_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    colours: Mapping[int, Callable[[str], str | None]] | None = None,
) -> None:
    """Print a table with bold headers, each value escaped (see :func:`redsaga.cli._format.cell`).

    On a terminal the table fits its width: the widest columns wrap, short ones (times,
    statuses, counts) stay whole, and when even that is too wide the lines are left for
    the terminal to wrap. Elsewhere (a pipe, a file) it is plain text: one line per row,
    columns padded with spaces. Cells of the ``colours`` columns are coloured by their
    value on a terminal. An empty table is its headers and ``(none)``, in every command.
    """
    cells = [[cell(value) for value in row] for row in rows]
    if not cells:
        emit_line("  ".join(headers), bold=True)
        emit_line(EMPTY)
        return
    colours = colours or {}
    natural = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    if not sys.stdout.isatty():
        for row in [list(headers), *cells]:
            typer.echo("  ".join(c.ljust(w) for c, w in zip(row, natural, strict=True)).rstrip())
        return
    console = Console(highlight=False, markup=False, emoji=False)
    widths = fit_columns(natural, console.width)
    table = Table(box=None, pad_edge=False, padding=(0, _GAP, 0, 0), header_style="bold")
    for header, width in zip(headers, widths, strict=True):
        table.add_column(header, width=width, overflow="fold")
    for row in cells:
        table.add_row(*(_styled(value, colours.get(index)) for index, value in enumerate(row)))
    console.width = max(console.width, sum(widths) + _GAP * (len(widths) - 1))
    console.print(table)


def _styled(value: str, colour_of: Callable[[str], str | None] | None) -> Text:
    colour = colour_of(value) if colour_of else None
    return Text(value, style=colour or "")


def fit_columns(natural: Sequence[int], available: int) -> list[int]:
    """Column widths for a terminal ``available`` wide: the widest columns give way first.

    A column no wider than :data:`WHOLE_COLUMN` keeps its width; a wider one shrinks, not
    below :data:`NARROWEST_WRAP`, until the columns and their gaps fit (or can shrink no more).
    """
    widths = list(natural)
    floors = [w if w <= WHOLE_COLUMN else NARROWEST_WRAP for w in natural]
    budget = available - _GAP * (len(widths) - 1)
    while sum(widths) > budget:
        widest = max(range(len(widths)), key=lambda i: widths[i] - floors[i])
        if widths[widest] <= floors[widest]:
            break
        widths[widest] -= 1
    return widths
