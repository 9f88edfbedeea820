"""The metrics port: ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP/1.1.

It runs on the worker's own event loop, so ``/metrics`` awaits the scrape-time Redis reads
like any other task, and a loop blocked by a handler shows as a ``/healthz`` that does not
answer (what a liveness probe should see). The requests, untrusted input on an open port,
are parsed by h11 (the HTTP/1.1 protocol library under uvicorn and httpx); this module only
routes them. It answers ``GET`` and ``HEAD`` only, one request per connection, with a request
head of at most 8 KiB read within a few seconds: enough for Prometheus and container health
checks, and nothing an attacker on the port can grow.

- ``/healthz``: 200 while the process's loop runs;
- ``/readyz``: 200 when the ``ready`` callable finds no problem, else 503 with one problem
  per line;
- ``/metrics``: the Prometheus text format from the ``metrics`` callable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Final

import anyio
import anyio.abc
import h11
from anyio.abc import SocketAttribute

from bus._log import get_logger

_log = get_logger("redsaga.bus")
DEFAULT_HOST: Final = "127.0.0.1"
TEXT: Final = "text/plain; charset=utf-8"
PROMETHEUS_TEXT: Final = "text/plain; version=0.0.4; charset=utf-8"
MAX_HEAD: Final = 8192
HEAD_TIMEOUT_S: Final = 5.0

_Answer = tuple[int, str, bytes]


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
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        async with stream:
            head_only = False
            try:
                request = await _read_request(connection, stream)
                if request is None:
                    return  # the client left before a whole request head
                if isinstance(request, int):
                    status, kind, body = request, TEXT, f"{HTTPStatus(request).phrase.lower()}\n".encode()
                else:
                    head_only = request.method == b"HEAD"
                    status, kind, body = await self._respond(request)
            except Exception:  # noqa: BLE001 - one failed scrape must not close the port
                _log.exception("metrics port: request failed")
                status, kind, body = 500, TEXT, b"internal error\n"
            answer = connection.send(
                h11.Response(
                    status_code=status,
                    reason=HTTPStatus(status).phrase,
                    headers=[
                        ("Content-Type", kind),
                        ("Content-Length", str(len(body))),
                        ("Connection", "close"),
                    ],
                )
            )
            if not head_only:
                answer += connection.send(h11.Data(data=body)) or b""
            answer += connection.send(h11.EndOfMessage()) or b""
            try:
                await stream.send(answer)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return  # the client left

    async def _respond(self, request: h11.Request) -> _Answer:
        if request.method not in (b"GET", b"HEAD"):
            return 405, TEXT, b"only GET and HEAD\n"
        path = request.target.split(b"?", 1)[0]
        route = {b"/healthz": self._healthz, b"/readyz": self._readyz, b"/metrics": self._metrics}.get(path)
        if route is None:
            return 404, TEXT, b"not found: try /metrics, /healthz or /readyz\n"
        return await route()

    async def _healthz(self) -> _Answer:
        return 200, TEXT, b"ok\n"

    async def _readyz(self) -> _Answer:
        problems = await self.ready()
        if problems:
            return 503, TEXT, "".join(f"{p}\n" for p in problems).encode()
        return 200, TEXT, b"ready\n"

    async def _metrics(self) -> _Answer:
        return 200, PROMETHEUS_TEXT, await self.metrics()


async def _read_request(
    connection: h11.Connection, stream: anyio.abc.SocketStream
) -> h11.Request | int | None:
    """The request on ``stream``, or the status to refuse it with (400, 408 or 431).

    ``None``: the client closed before sending a whole request head.
    """
    with anyio.move_on_after(HEAD_TIMEOUT_S):
        while True:
            try:
                event = connection.next_event()
            except h11.RemoteProtocolError as error:
                return error.error_status_hint
            if isinstance(event, h11.Request):
                return event
            if isinstance(event, h11.ConnectionClosed):
                return None
            try:
                connection.receive_data(await stream.receive(4096))
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                connection.receive_data(b"")
    return 408
