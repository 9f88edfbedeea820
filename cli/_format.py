r"""How output reads: escaped values, times, durations, statuses in colour, parsed durations.

Every value a human reads goes through :func:`cell` (or :func:`printable`): a control
character in a saga id, an error or a payload is shown escaped (``\x1b``, ``\n``), so it
can neither drive the terminal nor split a line. Colour is applied with styles that are
left out when stdout is not a terminal, so pipes, files and tests see plain text.
"""

from __future__ import annotations

import typer

from saga import SagaStatus, StepStatus
from saga.core.times import utc_text
from saga.ops.durations import human_ms, parse_duration
from saga.ops.text import printable

_STATUS_COLOURS = {
    SagaStatus.RUNNING: typer.colors.CYAN,
    SagaStatus.SUSPENDED: typer.colors.CYAN,
    SagaStatus.COMPENSATING: typer.colors.YELLOW,
    SagaStatus.COMPLETED: typer.colors.GREEN,
    SagaStatus.FAILED: typer.colors.RED,
    SagaStatus.COMPENSATED: typer.colors.YELLOW,
    SagaStatus.CANCELLED: typer.colors.YELLOW,
    SagaStatus.DEAD_LETTERED: typer.colors.RED,
    StepStatus.SUCCEEDED: typer.colors.GREEN,
    StepStatus.FAILED: typer.colors.RED,
    StepStatus.COMPENSATION_FAILED: typer.colors.RED,
    StepStatus.DISPATCHED: typer.colors.CYAN,
    StepStatus.RETRYING: typer.colors.YELLOW,
    StepStatus.COMPENSATING: typer.colors.YELLOW,
    StepStatus.COMPENSATED: typer.colors.YELLOW,
}
_OUTCOME_COLOURS = {
    "ok": typer.colors.GREEN,
    "forced": typer.colors.MAGENTA,
    "transient": typer.colors.YELLOW,
    "timeout": typer.colors.YELLOW,
    "permanent": typer.colors.RED,
    "cancelled": typer.colors.YELLOW,
}


def cell(value: object) -> str:
    """One value as a human reads it: ``-`` for none, ``yes``/``no``, else its text escaped."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return printable(str(value))


def status_colour(value: str) -> str | None:
    """The colour of a saga or step status (``None``: plain)."""
    for table in (SagaStatus, StepStatus):
        try:
            return _STATUS_COLOURS.get(table(value))
        except ValueError:
            continue
    return None


def outcome_colour(value: str) -> str | None:
    """The colour of an attempt outcome."""
    return _OUTCOME_COLOURS.get(value)


def when(ms: int | None) -> str:
    """A Unix-ms time as ``2026-11-29 12:01:03Z`` (UTC), or ``-``."""
    return utc_text(ms) if ms else "-"


def ago(ms: int | None) -> str:
    """A duration, or ``-``."""
    return "-" if ms is None else human_ms(max(0, ms))


def duration_option(text: str | int) -> int:
    """The parser of duration options: milliseconds, or a usage error (exit code 2).

    typer runs it on the default too: a default is given in milliseconds already.
    """
    if isinstance(text, int):
        return text
    try:
        return parse_duration(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


def partitions_option(text: str | tuple[int, ...] | None) -> tuple[int, ...]:
    """The parser of ``--partitions``: ``0-3,7`` gives (0, 1, 2, 3, 7); empty: every partition."""
    if text is None or isinstance(text, tuple):
        return text or ()
    indexes: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        if not first.isdigit() or not (last or first).isdigit() or int(last or first) < int(first):
            hint = "'--partitions'"
            raise typer.BadParameter(f"{part!r}: give partition indexes as 0-3,7", param_hint=hint)
        indexes += [i for i in range(int(first), int(last or first) + 1) if i not in indexes]
    return tuple(indexes)


def clip(text: str, width: int = 80) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= width else one_line[: width - 1] + "…"
