"""The metrics port: ``/metrics``, ``/healthz`` and ``/readyz`` over plain HTTP/1.1.

It runs on the worker's own event loop, so ``/metrics`` awaits the scrape-time Redis reads
like any other task, and a loop blocked by a handler shows as a ``/healthz`` that does not
answer (what a liveness probe should see). It answers ``GET`` and ``HEAD`` only, one request
per connection, with a request head of at most 8 KiB read within a few seconds: enough for
Prometheus and container health checks, and nothing an attacker on the port can grow.

- ``/healthz``: 200 while the process's loop runs;
- ``/readyz``: 200 when the ``ready`` callable finds no problem, else 503 with one problem
  per line;
- ``/metrics``: the Prometheus text format from the ``metrics`` callable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from bus._log import get_logger

_log = get_logger("redsaga.bus")
DEFAULT_HOST: Final = "127.0.0.1"
TEXT: Final = "text/plain; charset=utf-8"
PROMETHEUS_TEXT: Final = "text/plain; version=0.0.4; charset=utf-8"
MAX_HEAD: Final = 8192
HEAD_TIMEOUT_S: Final = 5.0
_REASONS: Final = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Error"}
_REASONS_503: Final = "Service Unavailable"


class MetricsServer:
    """Serves a worker's metrics and health on ``host:port`` (``port`` 0: any free port).

    ``metrics`` returns the exposition text of one scrape; ``ready`` returns why the worker is
    not ready (empty: ready). Run :meth:`serve` in a task group; ``task_status.started``
    reports the bound port (also :attr:`port`).
    """

    def __init__(
        self,
        metrics: Callable[[], Awaitable[bytes]],
        ready: Callable[[], Awaitable[list[str]]],
        *,
        host: str = DEFAULT_HOST,
        port: int = 0,
    ) -> None:
        self.metrics = metrics
        self.ready = ready
        self.host = host
        self.port = port

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen and answer until cancelled."""
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        async with listener:
            self.port = int(listener.extra(SocketAttribute.local_port))  # noqa: S610 - anyio, not Django
            _log.info("metrics port open", host=self.host, port=self.port)
            task_status.started(self.port)
            await listener.serve(self._answer)

    async def _answer(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            try:
                status, kind, body, head_only = await self._respond(stream)
            except Exception:  # noqa: BLE001 - one failed scrape must not close the port
                _log.exception("metrics port: request failed")
                status, kind, body, head_only = 500, TEXT, b"internal error\n", False
            reason = _REASONS_503 if status == 503 else _REASONS.get(status, "Error")
            header = (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            try:
                await stream.send(header if head_only else header + body)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return  # the client left

    async def _respond(self, stream: anyio.abc.SocketStream) -> tuple[int, str, bytes, bool]:
        request = await _read_head(stream)
        if request is None:
            return 400, TEXT, b"bad request\n", False
        method, path = request
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"only GET and HEAD\n", False
        route = {"/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics}.get(path)
        if route is None:
            return 404, TEXT, b"not found: try /metrics, /healthz or /readyz\n", method == "HEAD"
        return (*await route(), method == "HEAD")

    async def _healthz(self) -> tuple[int, str, bytes]:
        return 200, TEXT, b"ok\n"

    async def _readyz(self) -> tuple[int, str, bytes]:
        problems = await self.ready()
        if problems:
            return 503, TEXT, "".join(f"{p}\n" for p in problems).encode()
        return 200, TEXT, b"ready\n"

    async def _metrics(self) -> tuple[int, str, bytes]:
        return 200, PROMETHEUS_TEXT, await self.metrics()


async def _read_head(stream: anyio.abc.SocketStream) -> tuple[str, str] | None:
    """The method and path of the request on ``stream`` (``None``: not a usable request)."""
    data = b""
    with anyio.move_on_after(HEAD_TIMEOUT_S):
        while b"\r\n\r\n" not in data and len(data) <= MAX_HEAD:
            try:
                data += await stream.receive(4096)
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                break
    line = data.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return None
    method, target = parts[0].decode("ascii", "replace"), parts[1].decode("ascii", "replace")
    return method, target.split("?", 1)[0]
