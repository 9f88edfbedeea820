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

_CONFIG_KEYS = ("processors", "wrapper_class", "context_class", "logger_factory")
"""What a bound logger is built from: a change to any of them means binding again."""


class Logger:
    """A bound logger that picks its backend at each call (configuration may come later).

    Below the configured level a call costs about a microsecond: the stdlib logger is
    looked up once, and the structlog logger is bound once per configuration (a filtering
    one says whether the level is on without a logger being built for the call).
    """

    __slots__ = ("_bound", "_context", "_name", "_stdlib")

    def __init__(self, name: str, context: dict[str, Any] | None = None) -> None:
        self._name = name
        self._context = context or {}
        self._stdlib = logging.getLogger(name)  # one object per name for the process's life
        self._bound: tuple[tuple[Any, ...], Any] | None = None

    def bind(self, **values: Any) -> Logger:
        """A logger with more context."""
        return Logger(self._name, {**self._context, **values})

    def _backend(self, level: int) -> Any:
        """The logger to use, or ``None`` when it would drop this level anyway."""
        if structlog.is_configured():
            bound = self._structlog()
            enabled = getattr(bound, "is_enabled_for", None)  # a filtering bound logger's
            return None if enabled is not None and not enabled(level) else bound
        if not self._stdlib.isEnabledFor(level):
            return None
        return structlog.wrap_logger(
            self._stdlib,
            processors=_STDLIB_PROCESSORS,
            wrapper_class=structlog.stdlib.BoundLogger,
        ).bind(logger=self._name, **self._context)

    def _structlog(self) -> Any:
        """This logger bound in structlog's current configuration (re-bound when it changes)."""
        config = structlog.get_config()
        current = tuple(config[key] for key in _CONFIG_KEYS)
        cached = self._bound
        if cached is None or any(a is not b for a, b in zip(cached[0], current, strict=True)):
            cached = self._bound = (current, structlog.get_logger(self._name).bind(**self._context))
        return cached[1]

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
