"""A redis-py asyncio connection with a cheaper send path.

- Commands are packed with hiredis (C) when it is installed. redis-py's asyncio connection
  packs every argument in Python; our scripts take dozens of arguments (state fields,
  envelope fields), so packing was a quarter of a worker's CPU. ``hiredis.pack_command``
  produces the same RESP bytes.
- A send does not start a task. redis-py bounds the socket write with
  ``asyncio.wait_for``, which on Python 3.11 wraps the write in a new task: one task per
  command or pipeline, and the bytes leave one event-loop turn later. A write to an asyncio
  transport never blocks (it sends what the socket takes and buffers the rest), so only the
  wait for a full buffer to drain can take time; that wait keeps the socket timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from redis.asyncio.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

if TYPE_CHECKING:
    from redis.asyncio import Redis

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency; the fallback keeps redis-py's
    _hiredis_pack = None


class FastConnection(Connection):
    """A :class:`redis.asyncio.Connection` that packs with hiredis and sends without a task."""

    def pack_command(self, *args: Any) -> list[bytes]:
        """Pack one command into RESP (command names with spaces are split like redis-py)."""
        if _hiredis_pack is None:
            return super().pack_command(*args)
        first = args[0]
        if (isinstance(first, str) and " " in first) or (isinstance(first, bytes) and b" " in first):
            args = (*first.split(), *args[1:])
        return [_hiredis_pack(args)]

    async def connect(self) -> None:
        """Connect unless connected (redis-py goes through its retry wrapper either way)."""
        if not self.is_connected:
            await super().connect()  # type: ignore[no-untyped-call]

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
        try:
            writer.writelines(command)
            if writer.transport.get_write_buffer_size():
                async with asyncio.timeout(self.socket_timeout):
                    await writer.drain()
            else:
                await writer.drain()  # nothing buffered: returns at once, or raises a lost link
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as error:
            await self.disconnect(nowait=True)
            number, message = ("UNKNOWN", error.args[0]) if len(error.args) == 1 else error.args[:2]
            raise RedisConnectionError(f"Error {number} while writing to socket. {message}.") from error
        except BaseException:
            # a send cut short (cancelled) leaves the stream in an unknown state: like redis-py
            await self.disconnect(nowait=True)
            raise


async def send_batch(client: Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` in one write and read every reply: a lean pipeline (no MULTI).

    A reply that is an error is returned in place (a redis-py ``ResponseError``); replies
    are parsed with the client's response callbacks, as redis-py's pipeline does. A
    connection error or timeout disconnects and re-sends the whole batch under the client's
    retry policy, like redis-py: every batch redsaga sends is safe to repeat (idempotent
    scripts and reads). The socket timeout bounds each reply, as in redis-py.

    redis-py's own pipeline costs much more per command (a command stack with per-command
    options, observability and HIMPORT bookkeeping on every call); this is the busiest path
    of a worker. Clients not built by :func:`bus.connect` (fakeredis) get redis-py's pipeline.
    """
    pool = client.connection_pool
    connection_class = pool.connection_class
    if not (isinstance(connection_class, type) and issubclass(connection_class, FastConnection)):
        return await _redis_py_pipeline(client, commands)
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    callbacks = client.response_callbacks
    try:
        replies: list[Any] = await connection.retry.call_with_retry(
            lambda: _exchange(connection, commands, callbacks),
            lambda _error: connection.disconnect(),
        )
    finally:
        await pool.release(connection)
    return replies


async def _exchange(
    connection: FastConnection, commands: Sequence[tuple[Any, ...]], callbacks: Mapping[Any, Any]
) -> list[Any]:
    await connection.send_packed_command(connection.pack_commands(commands))
    replies: list[Any] = []
    for args in commands:
        try:
            reply = await connection.read_response()
        except ResponseError as error:  # an error reply: the stream stays in step
            replies.append(error)
            continue
        callback = callbacks.get(args[0])
        replies.append(reply if callback is None else callback(reply))
    return replies


async def _redis_py_pipeline(client: Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        for args in commands:
            pipe.execute_command(*args)
        return await pipe.execute(raise_on_error=False)
