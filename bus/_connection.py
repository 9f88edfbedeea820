"""A redis-py asyncio connection with a cheaper send path.

- Commands are packed with hiredis (C) when it is installed. redis-py's asyncio connection
  packs every argument in Python; our scripts take dozens of arguments (state fields,
  envelope fields), so packing was a quarter of a worker's CPU. ``hiredis.pack_command``
  produces the same RESP bytes.
- A pool checkout is synchronous when a connection is free (see :class:`FastPool`).
- A send does not start a task. redis-py bounds the socket write with
  ``asyncio.wait_for``, which on Python 3.11 wraps the write in a new task: one task per
  command or pipeline, and the bytes leave one event-loop turn later. A write to an asyncio
  transport never blocks (it sends what the socket takes and buffers the rest), so only the
  wait for a full buffer to drain can take time; that wait keeps the socket timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from redis.asyncio.connection import BlockingConnectionPool, Connection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bus._cluster import is_cluster
from bus._cluster_batch import send_cluster_batch

_ReleasedEvent: Any
try:
    from redis.event import AsyncAfterConnectionReleasedEvent as _ReleasedEvent
except ImportError:  # pragma: no cover - older redis-py has no pool events
    _ReleasedEvent = None

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

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

    async def read_replies(self, count: int) -> list[Any]:
        """Read ``count`` raw replies (an error reply in place) within one socket timeout.

        What ``read_response`` does per reply, once per batch: its timeout context, its
        error mapping (a timeout or ``OSError`` closes the connection and raises redis-py's
        ``TimeoutError`` or ``ConnectionError``), and the health-check bookkeeping.
        """
        read = self._parser.read_response  # type: ignore[attr-defined]
        try:
            async with asyncio.timeout(self.socket_timeout):
                replies = [await read() for _ in range(count)]
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError(f"Timeout reading from {self._host_error()}") from None
        except OSError as error:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(
                f"Error while reading from {self._host_error()} : {error.args}"
            ) from error
        except BaseException:
            # a read cut short leaves replies on the wire: never reuse the connection
            await self.disconnect(nowait=True)
            raise
        if self.health_check_interval:
            self.next_health_check = asyncio.get_running_loop().time() + self.health_check_interval
        return replies

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


_FAST_POOL_NEEDS = (
    "_available_connections",
    "_in_use_connections",
    "_condition",
    "_lock",
    "_event_dispatcher",
)


class FastPool(BlockingConnectionPool):
    """redis-py's blocking pool, with a synchronous checkout when a connection is free.

    redis-py's checkout takes the pool's condition, a timeout context, a predicate wait and
    an async context manager, and its release the condition and a lock again, plus
    observability records: about 30 us per command on this project's machines, paid by
    every command and pipeline. When a connection is free and nobody waits for one, taking
    it (and giving it back) cannot wait, so it is done directly; the connection is still
    checked (``ensure_connection``: connected, nothing unread) and released connections
    still notify redis-py's listeners. Anything else (no free connection, waiters,
    maintenance mode) goes through redis-py unchanged. Not recorded in redis-py's optional
    OpenTelemetry pool metrics (redsaga does not enable them).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fast = _ReleasedEvent is not None and all(hasattr(self, name) for name in _FAST_POOL_NEEDS)

    def _uncontended(self) -> bool:
        condition: Any = self._condition
        return (
            self._fast
            and not getattr(self, "_in_maintenance", False)
            and not condition.locked()
            and not condition._waiters  # asyncio.Condition has no public count of waiters
            and not self._lock.locked()
        )

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A free connection at once if there is one and nobody waits; else redis-py's wait."""
        if args or kwargs or not (self._available_connections and self._uncontended()):
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        connection = self._available_connections.pop()
        self._in_use_connections.add(connection)
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: Any) -> None:
        """Give ``connection`` back (redis-py's release when someone waits for one)."""
        if not self._uncontended():
            await super().release(connection)
            return
        self._in_use_connections.remove(connection)
        should_reconnect = getattr(connection, "should_reconnect", None)
        if should_reconnect is not None and should_reconnect():
            await connection.disconnect()
        self._available_connections.append(connection)
        dispatcher: Any = self._event_dispatcher
        await dispatcher.dispatch_async(_ReleasedEvent(connection))


def is_lean(client: Redis) -> bool:
    """Whether ``client`` was built by :func:`bus.connect` for a real server (lean paths apply)."""
    if is_cluster(client):
        return False
    connection_class = client.connection_pool.connection_class
    return isinstance(connection_class, type) and issubclass(connection_class, FastConnection)


async def send_batch(client: Redis, commands: Sequence[tuple[Any, ...]], *, parse: bool = True) -> list[Any]:
    """Send ``commands`` in one write and read every reply: a lean pipeline (no MULTI).

    A reply that is an error is returned in place (a redis-py ``ResponseError``); replies
    are parsed with the client's response callbacks, as redis-py's pipeline does. A
    connection error or timeout disconnects and re-sends the whole batch under the client's
    retry policy, like redis-py: every batch redsaga sends is safe to repeat (idempotent
    functions, reads, and ``FUNCTION LOAD``, whose repeat finds the library there). The
    socket timeout bounds each reply, as in redis-py.

    redis-py's own pipeline costs much more per command (a command stack with per-command
    options, observability and HIMPORT bookkeeping on every call); this is the busiest path
    of a worker. With ``parse=False`` the replies are raw RESP2 (lists and bytes); that
    needs a lean client (:func:`is_lean`). Clients not built by :func:`bus.connect`
    (fakeredis) get redis-py's pipeline.
    """
    if is_cluster(client):
        if not parse:
            raise TypeError("raw replies need a client built by bus.connect for a single server")
        return await send_cluster_batch(cast("RedisCluster", client), commands)
    if not is_lean(client):
        if not parse:
            raise TypeError("raw replies need a client built by bus.connect for a real server")
        return await _redis_py_pipeline(client, commands)
    pool = client.connection_pool
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    callbacks = client.response_callbacks if parse else {}
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
    replies = await connection.read_replies(len(commands))
    for index, (args, reply) in enumerate(zip(commands, replies, strict=True)):
        callback = callbacks.get(args[0])
        if callback is not None and not isinstance(reply, ResponseError):
            replies[index] = callback(reply)
    return replies


async def _redis_py_pipeline(client: Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        for args in commands:
            pipe.execute_command(*args)
        return await pipe.execute(raise_on_error=False)
