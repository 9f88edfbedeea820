"""structlog configuration for long-running commands: JSON lines on stderr, or readable ones.

stdout stays for what a command prints (its table or ``--json`` document); logs never go there.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Literal

import structlog
import typer

Level = Literal["debug", "info", "warning", "error"]
LogLevel = Annotated[Level, typer.Option("--log-level", help="The lowest level logged.")]
ConsoleLogs = Annotated[
    bool, typer.Option("--console-logs", help="Readable log lines instead of JSON lines (on stderr).")
]


def configure(*, json_logs: bool, level: Level = "info") -> None:
    """Send structlog output to stderr as JSON lines (``json_logs``) or for humans."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json_logs
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
