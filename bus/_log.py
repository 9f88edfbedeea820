"""Loggers for the library: structlog when the application configured it, else stdlib logging.

A library must not print to stdout on its own. When the application configured structlog
(``saga worker`` does: JSON lines), our events go through it with their bound context
(saga id, step, entry). Otherwise they go to the stdlib logger of the same name, which is
silent below WARNING until the application configures ``logging``.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

_STDLIB_PROCESSORS: list[Any] = [
    structlog.processors.add_log_level,
    structlog.processors.KeyValueRenderer(key_order=["event"], drop_missing=True),
]


class Logger:
    """A bound logger that picks its backend at each call (configuration may come later)."""

    __slots__ = ("_context", "_name")

    def __init__(self, name: str, context: dict[str, Any] | None = None) -> None:
        self._name = name
        self._context = context or {}

    def bind(self, **values: Any) -> Logger:
        """A logger with more context."""
        return Logger(self._name, {**self._context, **values})

    def _backend(self, level: int) -> Any:
        """The logger to use, or ``None`` when stdlib logging would drop this level anyway."""
        if structlog.is_configured():
            return structlog.get_logger(self._name).bind(**self._context)
        if not logging.getLogger(self._name).isEnabledFor(level):
            return None
        return structlog.wrap_logger(
            logging.getLogger(self._name),
            processors=_STDLIB_PROCESSORS,
            wrapper_class=structlog.stdlib.BoundLogger,
        ).bind(logger=self._name, **self._context)

    def debug(self, event: str, **values: Any) -> None:
        """Log at DEBUG."""
        backend = self._backend(logging.DEBUG)
        if backend is not None:
            backend.debug(event, **values)

    def info(self, event: str, **values: Any) -> None:
        """Log at INFO."""
        backend = self._backend(logging.INFO)
        if backend is not None:
            backend.info(event, **values)

    def warning(self, event: str, **values: Any) -> None:
        """Log at WARNING."""
        backend = self._backend(logging.WARNING)
        if backend is not None:
            backend.warning(event, **values)

    def error(self, event: str, **values: Any) -> None:
        """Log at ERROR."""
        backend = self._backend(logging.ERROR)
        if backend is not None:
            backend.error(event, **values)

    def exception(self, event: str, **values: Any) -> None:
        """Log at ERROR with the current exception's traceback."""
        backend = self._backend(logging.ERROR)
        if backend is not None:
            backend.exception(event, **values)


def get_logger(name: str) -> Logger:
    """The logger called ``name`` (``redsaga.bus``, ``redsaga.saga``, …)."""
    return Logger(name)
