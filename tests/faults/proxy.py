"""A loopback TCP proxy that a fault test puts between its clients and Redis or PostgreSQL.

The proxy listens on a free loopback port and forwards every connection to its target. Its
mode applies at once to every open connection and to new ones:

- ``pass``: forward both ways.
- ``delay``: hold every chunk, both ways, for ``delay_s`` plus a seeded random jitter in
  ``[0, jitter_s]`` (order is kept: each direction is one sequential pump).
- ``blackhole``: accept and read, forward nothing, answer nothing (a link that eats
  packets). Connections that lost bytes this way are out of step with their server, so
  they are closed when the mode changes again (their clients gave up on them anyway).
- ``reset``: send an RST on every connection (``SO_LINGER`` 0, then close); new ones are
  accepted and reset at once.
- ``swallow_reply``: forward a request, swallow its reply, then close the connection: the
  ambiguous write (the server ran the command, the client sees a connection error and
  redis-py re-sends it). ``match`` restricts it to requests whose bytes contain it (an
  ``FCALL``'s function name, say), ``reply_match`` to replies that contain it (the others
  pass), and ``times`` to that many replies, after which the proxy passes again.

Use it in the test's event loop (``async with FaultProxy(host, port) as proxy``) or, for
synchronous code, in a thread of its own (:class:`ThreadedProxy`). ``proxy.counters``
counts connections, bytes and injected faults, so a test can check that its fault fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit, urlunsplit

_CHUNK = 1 << 16


class Mode(StrEnum):
    """What the proxy does to the traffic (see the module docstring)."""

    PASS = "pass"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    RESET = "reset"
    SWALLOW_REPLY = "swallow_reply"


@dataclass
class Counters:
    """What went through the proxy, and which faults it injected."""

    connections: int = 0
    open: int = 0
    bytes_up: int = 0  # client to server
    bytes_down: int = 0  # server to client
    dropped_bytes: int = 0  # eaten by the blackhole
    resets: int = 0
    swallowed: int = 0  # replies swallowed (their connection closed)


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    armed: bool = False  # a matching request was forwarded: its reply may be swallowed
    tainted: bool = False  # bytes were blackholed: the byte streams are out of step
    closed: bool = False


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """A TCP proxy from a free loopback port to ``host:port``, with switchable faults."""

    def __init__(self, host: str, port: int, *, seed: int = 0) -> None:
        self.target = (host, port)
        self.counters = Counters()
        self.mode = Mode.PASS
        self._delay = (0.0, 0.0)
        self._match: bytes | None = None
        self._reply_match: bytes | None = None
        self._times: int | None = None
        self._rng = random.Random(seed)
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    @classmethod
    def to_url(cls, url: str, *, seed: int = 0) -> FaultProxy:
        """A proxy to the host and port of ``url`` (redis:// or postgresql://)."""
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 6379, seed=seed)

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    async def start(self) -> None:
        """Listen on a free loopback port (``self.port``)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            self._close(link)
        tasks = [t for link in list(self._links) for t in link.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def set_mode(
        self,
        mode: Mode | str,
        *,
        delay_s: float = 0.0,
        jitter_s: float = 0.0,
        match: bytes | None = None,
        reply_match: bytes | None = None,
        times: int | None = None,
    ) -> None:
        """Switch every connection, open and new, to ``mode`` (call from the proxy's loop).

        ``delay_s``/``jitter_s`` are for ``delay``; ``match``, ``reply_match`` and ``times``
        for ``swallow_reply``.
        """
        mode = Mode(mode)
        if self.mode == Mode.BLACKHOLE and mode != Mode.BLACKHOLE:
            for link in [link for link in self._links if link.tainted]:
                self._close(link)
        self.mode = mode
        self._delay = (delay_s, jitter_s)
        self._match, self._reply_match, self._times = match, reply_match, times
        if mode == Mode.RESET:
            for link in list(self._links):
                self._close(link, reset=True)

    def _close(self, link: _Link, *, reset: bool = False) -> None:
        if link.closed:
            return
        link.closed = True
        self._links.discard(link)
        self.counters.open -= 1
        for writer in (link.client, link.server):
            if writer is None:
                continue
            if reset:
                _reset(writer)
            else:
                writer.transport.abort()
        if reset:
            self.counters.resets += 1
        current = asyncio.current_task()
        for task in link.tasks:
            if task is not current:
                task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(client=writer)
        self._links.add(link)
        self.counters.connections += 1
        self.counters.open += 1
        if self.mode == Mode.RESET:
            self._close(link, reset=True)
            return
        try:
            server_reader, link.server = await asyncio.open_connection(*self.target)
        except OSError:
            self._close(link, reset=True)
            return
        if link.closed:  # reset while connecting
            link.server.transport.abort()
            return
        link.tasks = [
            asyncio.ensure_future(self._pump(link, reader, link.server, up=True)),
            asyncio.ensure_future(self._pump(link, server_reader, link.client, up=False)),
        ]
        await asyncio.gather(*link.tasks, return_exceptions=True)

    async def _pump(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool
    ) -> None:
        try:
            while not link.closed:
                chunk = await reader.read(_CHUNK)
                if not chunk:
                    break
                if await self._forward(link, chunk, writer, up=up):
                    await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._close(link)

    async def _forward(self, link: _Link, chunk: bytes, writer: asyncio.StreamWriter, *, up: bool) -> bool:
        """Apply the mode to one chunk; return whether it was written."""
        if self.mode == Mode.DELAY:
            delay, jitter = self._delay
            await asyncio.sleep(delay + self._rng.uniform(0, jitter))  # the injected latency itself
        mode = self.mode
        if mode == Mode.BLACKHOLE:
            link.tainted = True
            self.counters.dropped_bytes += len(chunk)
            return False
        if not up and link.armed:
            link.armed = False
            if self._takes(chunk):
                self.counters.swallowed += 1
                self._close(link)
                return False
        if up and mode == Mode.SWALLOW_REPLY and (self._match is None or self._match in chunk):
            link.armed = True
        writer.write(chunk)
        if up:
            self.counters.bytes_up += len(chunk)
        else:
            self.counters.bytes_down += len(chunk)
        return True

    def _takes(self, reply: bytes) -> bool:
        if self.mode != Mode.SWALLOW_REPLY:
            return False
        if self._reply_match is not None and self._reply_match not in reply:
            return False
        if self._times is not None:
            self._times -= 1
            if self._times <= 0:
                self.mode = Mode.PASS
        return True


class ThreadedProxy:
    """A :class:`FaultProxy` running on an event loop in its own thread (for sync code)."""

    def __init__(self, host: str, port: int, *, seed: int = 0) -> None:
        self.proxy = FaultProxy(host, port, seed=seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    def _run(self, make: Callable[[], Awaitable[None]]) -> None:
        async def call() -> None:
            await make()

        asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=30)

    def start(self) -> int:
        """Start the thread and the proxy; return its port."""
        self._thread.start()
        self._run(self.proxy.start)
        return self.proxy.port

    def set_mode(self, mode: Mode | str, **options: object) -> None:
        """:meth:`FaultProxy.set_mode`, run on the proxy's loop."""

        async def switch() -> None:
            self.proxy.set_mode(mode, **options)  # type: ignore[arg-type]

        self._run(switch)

    def close(self) -> None:
        """Stop the proxy and its thread."""
        self._run(self.proxy.aclose)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
