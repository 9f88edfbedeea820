"""The lean connection: a batch sent in one write, its replies read in one timeout (internals 1-4).

See :mod:`bus._redispy` for the internals each use and the TLS rule.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Sequence
from typing import Any, Final

from hiredis import PushNotification
from hiredis import pack_command as _hiredis_pack
from redis import exceptions as rx
from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
from redis._parsers.hiredis import _AsyncHiredisParser as _HiredisParser
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection, parse_url

from bus._deadline import ReadDeadline

_SERVER_CLOSED: Final = "Connection closed by server."


class LeanConnection(AbstractConnection):
    """The lean send and read paths, mixed into each redis-py connection class that has a twin.

    - Commands are packed with hiredis (C): redis-py's asyncio connection packs every
      argument in Python, and redsaga's scripts take dozens of arguments.
    - A send does not start a task. redis-py bounds the socket write with
      ``asyncio.wait_for``, which on Python 3.11 wraps the write in a new task: one task per
      command or pipeline, and the bytes leave one event-loop turn later. A write to an
      asyncio transport never blocks (it sends what the socket takes and buffers the rest),
      so only the wait for a full buffer to drain can take time; that wait keeps the socket
      timeout.
    - A batch's replies are read within one socket timeout.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        """Pack one command into RESP (command names with spaces are split like redis-py)."""
        return [_hiredis_pack(_split_name(args))]

    def pack_batch(self, commands: Sequence[tuple[Any, ...]]) -> bytes:
        """Pack ``commands`` into the bytes of one write."""
        if len(commands) == 1:
            packed: bytes = _hiredis_pack(_split_name(commands[0]))
            return packed
        return b"".join([_hiredis_pack(_split_name(args)) for args in commands])

    async def connect(self) -> None:
        """Connect unless connected (redis-py goes through its retry wrapper either way)."""
        if not self.is_connected:
            await super().connect()  # type: ignore[no-untyped-call]

    async def read_replies(self, count: int) -> list[Any]:
        """Read ``count`` raw replies (an error reply in place) within one socket timeout.

        What ``read_response`` does per reply, once per batch: its timeout (a
        :class:`~bus._deadline.ReadDeadline`, moved rather than made per read), its
        error mapping (a timeout or ``OSError`` closes the connection and raises redis-py's
        ``TimeoutError`` or ``ConnectionError``), and the health-check bookkeeping. With
        redis-py's hiredis parser the replies are taken from its reader directly
        (:meth:`_take_replies`); with any other parser, through its ``read_response``.
        """
        parser: Any = self._parser
        deadline = self._read_deadline
        if self.socket_timeout is not None:
            deadline.arm(self.socket_timeout)
        try:
            if type(parser) is _HiredisParser and parser._connected:
                replies = await self._take_replies(parser, count)
            else:
                read = parser.read_response
                replies = [await read() for _ in range(count)]
        except asyncio.CancelledError:
            timed_out = deadline.passed()
            await self.disconnect(nowait=True)  # a read cut short: never reuse the connection
            if timed_out:
                raise rx.TimeoutError(f"Timeout reading from {self._host_error()}") from None
            raise
        except OSError as error:
            await self.disconnect(nowait=True)
            host = self._host_error()
            raise rx.ConnectionError(f"Error while reading from {host} : {error.args}") from error
        except BaseException:
            # a read cut short leaves replies on the wire: never reuse the connection
            await self.disconnect(nowait=True)
            raise
        finally:
            deadline.disarm()
        if self.health_check_interval:
            self.next_health_check = asyncio.get_running_loop().time() + self.health_check_interval
        return replies

    @staticmethod
    async def _take_replies(parser: Any, count: int) -> list[Any]:
        """``count`` replies from the hiredis reader of redis-py's parser, fed from its stream.

        What the parser's ``read_response`` does for each reply, without its two calls per
        reply and per read: a reply whose error means a lost link (redis-py's
        ``ConnectionError`` family, alone or first in an array) is raised; a push message
        (RESP3 only, which redsaga does not ask for) goes to the parser's own handling.
        """
        reader, stream, size = parser._reader, parser._stream, parser._read_size
        replies: list[Any] = []
        while len(replies) < count:
            reply = reader.gets()
            if reply is _NOT_ENOUGH_DATA:
                data = await stream.read(size)
                if not data:
                    raise rx.ConnectionError(_SERVER_CLOSED)
                reader.feed(data)
                continue
            if isinstance(reply, PushNotification):
                reply = await parser.handle_push_response(reply)
                continue
            if isinstance(reply, rx.ConnectionError):
                raise reply
            if type(reply) is list and reply and isinstance(reply[0], rx.ConnectionError):
                raise reply[0]
            replies.append(reply)
        return replies

    def ready(self) -> bool:
        """Whether the connection may take a command now: connected, nothing unread.

        What redis-py's pool checks at every checkout (``ensure_connection``), without a
        coroutine, for the hiredis parser; ``False`` sends the caller to redis-py's checkout.
        """
        parser: Any = self._parser
        if self._writer is None or type(parser) is not _HiredisParser or not parser._connected:
            return False
        reader: Any = parser._reader
        stream: Any = parser._stream
        return not (reader.has_data() or stream._buffer or stream.at_eof() or stream.exception() is not None)

    async def exchange(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write and read their raw replies: one round trip.

        :meth:`send_packed_command` and :meth:`read_replies` in one call, with the write
        made straight to the transport when the link is up and the health check not due.
        """
        data = self.pack_batch(commands)
        writer = self._writer
        if writer is None or (
            self.health_check_interval and asyncio.get_running_loop().time() > self.next_health_check
        ):
            await self.send_packed_command([data])
            return await self.read_replies(len(commands))
        transport = writer.transport
        if transport.is_closing():
            await self.disconnect(nowait=True)
            raise rx.ConnectionError("Connection closed by the server before write")
        transport.write(data)
        if transport.get_write_buffer_size():
            await self._drain(writer)
        return await self.read_replies(len(commands))

    @functools.cached_property
    def _read_deadline(self) -> ReadDeadline:
        return ReadDeadline()

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        """Write ``command``; wait (up to the socket timeout) only if the buffer is full.

        Errors are redis-py's: a write timeout or an ``OSError`` closes the connection and
        raises ``TimeoutError`` or ``ConnectionError``, which its retry policy handles.
        """
        if not self.is_connected or isinstance(command, str | bytes):
            await super().send_packed_command(command, check_health)
            return
        if check_health:
            await self.check_health()  # type: ignore[no-untyped-call]
        writer = self._writer
        if writer is None:  # the health check dropped the link: redis-py reconnects
            await super().send_packed_command(command, check_health=False)
            return
        writer.writelines(command)
        await self._drain(writer)

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait (up to the socket timeout) for what is buffered to leave; redis-py's errors."""
        try:
            if writer.transport.get_write_buffer_size():
                async with asyncio.timeout(self.socket_timeout):
                    await writer.drain()
            else:
                await writer.drain()  # nothing buffered: returns at once, or raises a lost link
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise rx.TimeoutError("Timeout writing to socket") from None
        except OSError as error:
            await self.disconnect(nowait=True)
            number, message = ("UNKNOWN", error.args[0]) if len(error.args) == 1 else error.args[:2]
            raise rx.ConnectionError(f"Error {number} while writing to socket. {message}.") from error
        except BaseException:
            # a send cut short (cancelled) leaves the stream in an unknown state: like redis-py
            await self.disconnect(nowait=True)
            raise


def _split_name(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with a command name holding spaces (``"SCRIPT LOAD"``) split, as redis-py does."""
    first = args[0]
    if (isinstance(first, str) and " " in first) or (isinstance(first, bytes) and b" " in first):
        return (*first.split(), *args[1:])
    return args


class LeanTCPConnection(LeanConnection, Connection):
    """The lean paths over plain TCP (``redis://``)."""


class LeanTLSConnection(LeanConnection, SSLConnection):
    """The lean paths over TLS (``rediss://``): redis-py's TLS handshake and checks, unchanged."""


_LEAN_TWINS: Final[dict[type[AbstractConnection], type[LeanConnection]]] = {
    Connection: LeanTCPConnection,
    SSLConnection: LeanTLSConnection,
}


def pool_options(url: str) -> dict[str, Any]:
    """redis-py's options for ``url`` (host, credentials, TLS), with the lean twin of its class.

    Raises ``ValueError`` (redis-py's, or :func:`lean_connection_class`'s) for a URL that
    cannot be used; its message holds no part of the URL.
    """
    options: dict[str, Any] = dict(parse_url(url))
    options["connection_class"] = lean_connection_class(url, options.get("connection_class", Connection))
    return options


def lean_connection_class(url: str, chosen: type[AbstractConnection]) -> type[AbstractConnection]:
    """The lean twin of ``chosen`` (redis-py's class for ``url``), or ``chosen`` itself.

    Raises ``ValueError`` when ``url`` asks for TLS and the class would not speak it.
    """
    twin = _LEAN_TWINS.get(chosen, chosen)
    if url.lower().startswith("rediss") and not issubclass(twin, SSLConnection):
        raise ValueError(f"TLS was asked for, but the connection class {twin.__name__} does not speak it")
    return twin


def is_lean_class(connection_class: object) -> bool:
    """Whether ``connection_class`` has the lean paths."""
    return isinstance(connection_class, type) and issubclass(connection_class, LeanConnection)
