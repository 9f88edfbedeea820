"""Serving the UI: a listening socket first (a busy port is an error before anything runs), then uvicorn."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
"""The host names a UI listening on the loopback answers to (besides the address it was given)."""


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` answers only this machine."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def allowed_hosts(host: str) -> list[str]:
    """The ``Host`` names a UI listening on ``host`` answers to.

    On the loopback only loopback names, so that no web page can read the UI through a DNS
    name it points at 127.0.0.1 (DNS rebinding); elsewhere any name.
    """
    return [*LOOPBACK_NAMES, host] if is_loopback(host) else ["*"]


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (port 0: a free one); ``OSError`` when it cannot bind.

    Connections made once it returns wait in its backlog until the server accepts them, so
    a client may connect before :func:`ui_server`'s server has started.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def ui_server(app: Any, *, log_level: str = "warning") -> uvicorn.Server:
    """A uvicorn server for ``app``: ``await server.serve([socket])``; ``server.should_exit = True`` stops it.

    Its logs go to stderr; requests are logged at ``debug`` only.
    """
    level = logging.getLevelNamesMapping()[log_level.upper()]
    config = uvicorn.Config(
        app,
        log_config={
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {
                "default": {"()": "uvicorn.logging.DefaultFormatter", "fmt": "%(levelprefix)s %(message)s"}
            },
            "handlers": {
                "stderr": {
                    "formatter": "default",
                    "class": "logging.StreamHandler",
                    "stream": "ext://sys.stderr",
                }
            },
            "loggers": {"uvicorn": {"handlers": ["stderr"], "level": level, "propagate": False}},
        },
        access_log=level <= logging.DEBUG,
        lifespan="off",
        server_header=False,
    )
    return _Server(config)


class _Server(uvicorn.Server):
    """The uvicorn server, for which SIGINT and SIGTERM are a stop asked for: a clean exit.

    uvicorn stops gracefully on them, then raises the signal again for the handler that was
    there before it (Python's: ``KeyboardInterrupt``, or death by SIGTERM, exit code -15).
    This server forgets the signals it stopped on instead, so ``saga ui`` exits with 0.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """The signal handling of uvicorn, without raising the captured signals again afterwards."""
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()
