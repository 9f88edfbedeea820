"""redis-py at arm's length: every use of its internals, in this one module.

redsaga's lean paths (a batch sent in one write with its replies read in one timeout, a pool
checkout without a wait when a connection is free) and its repairs of the cluster client
reach past redis-py's public API. They live here and nowhere else; pyproject.toml bounds
redis-py to the minor versions the suite has passed on, and ``tests/bus/test_redispy.py``
checks each internal below against the installed redis-py, failing with its name when a
release moves it.

Internals used (``redis.asyncio`` unless named otherwise):

1. ``Connection._parser.read_response()``: one reply, without the timeout context that
   ``read_response`` opens per reply (:meth:`LeanConnection.read_replies`).
2. ``Connection._writer``: the stream the bytes go to, written without the task that
   ``send_packed_command`` starts per send (:meth:`LeanConnection.send_packed_command`,
   :class:`GuardedConnection`).
3. ``Connection._host_error()``: the server's name in redis-py's error messages.
4. ``Connection.next_health_check``: health-check bookkeeping after a read.
5. ``Connection._send_packed_command()``: the write a cluster node's connection makes
   (:class:`GuardedConnection`).
6. ``BlockingConnectionPool._available_connections``, ``_in_use_connections``,
   ``_condition``, ``_lock``, ``_event_dispatcher``, ``_in_maintenance`` and
   ``redis.event.AsyncAfterConnectionReleasedEvent``: the checkout without a wait
   (:class:`LeanPool`).
7. ``NodesManager.connection_kwargs["connection_class"]`` and ``ClusterNode.connection_class``:
   the class of a cluster node's connections (:func:`use_cluster_connection_class`).
8. ``RedisCluster._initialize``, ``ClusterNode.update_active_connections_for_reconnect()``,
   ``ClusterNode.disconnect_free_connections()`` and ``RedisCluster._request_refresh`` (its
   presence): redis-py before 8.2 closes the whole cluster client to re-read the slot map
   (:func:`close_cluster`).
9. ``RedisCluster.nodes_manager.get_node_from_slot()`` and ``.initialize()`` (public names
   of an undocumented object): the master of a slot and a fresh read of the slot map.
10. ``redis.event.EventDispatcher._event_listeners_mapping``,
    ``redis.event.AsyncReAuthConnectionListener`` and ``Connection._re_auth_token``: a
    released connection's event is not dispatched when redis-py's re-authentication is
    its only listener and the connection has no token to re-authenticate with
    (:meth:`LeanPool.release`).

The TLS rule: the lean connection class is always a subclass of the class redis-py picks
for the URL (``parse_url``: TCP or TLS); a URL whose class has no lean twin (a Unix socket)
keeps redis-py's own, and :func:`lean_connection_class` refuses a ``rediss`` URL whose
class would not speak TLS. A TLS option therefore never meets a plain connection.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

from redis import exceptions as rx
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    BlockingConnectionPool,
    Connection,
    SSLConnection,
    parse_url,
)

from bus._deadline import ReadDeadline

_ReleasedEvent: Any
_ReAuthListener: Any
try:
    from redis.event import AsyncAfterConnectionReleasedEvent as _ReleasedEvent
    from redis.event import AsyncReAuthConnectionListener as _ReAuthListener
except ImportError:  # pragma: no cover - tests/bus/test_redispy.py fails on such a redis-py
    _ReleasedEvent = _ReAuthListener = None

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency; the fallback keeps redis-py's
    _hiredis_pack = None


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

        What ``read_response`` does per reply, once per batch: its timeout (a
        :class:`~bus._deadline.ReadDeadline`, moved rather than made per read), its
        error mapping (a timeout or ``OSError`` closes the connection and raises redis-py's
        ``TimeoutError`` or ``ConnectionError``), and the health-check bookkeeping.
        """
        read = self._parser.read_response  # type: ignore[attr-defined]
        deadline = self._read_deadline
        if self.socket_timeout is not None:
            deadline.arm(self.socket_timeout)
        try:
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
        try:
            writer.writelines(command)
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


_LEAN_POOL_NEEDS: Final = (
    "_available_connections",
    "_in_use_connections",
    "_condition",
    "_lock",
    "_event_dispatcher",
)


class LeanPool(BlockingConnectionPool):
    """redis-py's blocking pool, with a synchronous checkout when a connection is free.

    redis-py's checkout takes the pool's condition, a timeout context, a predicate wait and
    an async context manager, and its release the condition and a lock again, plus
    observability records: about 30 us per command on this project's machines, paid by
    every command and pipeline. When a connection is free and nobody waits for one, taking
    it (and giving it back) cannot wait, so it is done directly; the connection is still
    checked (``ensure_connection``: connected, nothing unread) and released connections
    still notify redis-py's listeners (except its re-authentication when the connection has
    no token to re-authenticate with: internal 10). Anything else (no free connection, waiters,
    maintenance mode) goes through redis-py unchanged. Not recorded in redis-py's optional
    OpenTelemetry pool metrics (redsaga does not enable them).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        needs = _LEAN_POOL_NEEDS
        self.lean_checkout = _ReleasedEvent is not None and all(hasattr(self, name) for name in needs)
        """Whether the checkout without a wait applies (the internals it needs are there)."""

    def _uncontended(self) -> bool:
        condition: Any = self._condition
        return (
            self.lean_checkout
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
        if getattr(connection, "_re_auth_token", None) is None and _only_re_auth_listens(dispatcher):
            return  # the one listener would find nothing to do, and a dispatch takes a lock
        await dispatcher.dispatch_async(_ReleasedEvent(connection))


def _only_re_auth_listens(dispatcher: Any) -> bool:
    """Whether redis-py's re-authentication is all that listens to released connections."""
    mapping = getattr(dispatcher, "_event_listeners_mapping", None)
    if not isinstance(mapping, dict):
        return False
    return all(type(listener) is _ReAuthListener for listener in mapping.get(_ReleasedEvent, ()))


class GuardedConnection(AbstractConnection):
    """A cluster node's connection whose write fails as a lost link when another task dropped it.

    redis-py's cluster client disconnects a node's idle connections after a connection
    error (``disconnect_free_connections``) while they stay in the free list, so a task can
    take one, and find its writer gone in the middle of the send: an ``AttributeError`` from
    inside redis-py, which no caller retries. Here it is redis-py's ``ConnectionError``,
    which the cluster client retries on a fresh connection.
    """

    async def _send_packed_command(self, command: Iterable[bytes]) -> None:
        writer = self._writer
        if writer is None:
            raise rx.ConnectionError("the connection was closed under this command (a node was recycled)")
        writer.writelines(command)
        await writer.drain()


class GuardedTCPConnection(GuardedConnection, Connection):
    """:class:`GuardedConnection` over TCP."""


class GuardedTLSConnection(GuardedConnection, SSLConnection):
    """:class:`GuardedConnection` over TLS."""


def use_cluster_connection_class(client: RedisCluster, *, tls: bool) -> None:
    """Make every node of ``client`` (known now or found later) connect with a guarded class."""
    connection_class = GuardedTLSConnection if tls else GuardedTCPConnection
    client.nodes_manager.connection_kwargs["connection_class"] = connection_class  # nodes found later
    for node in client.nodes_manager.startup_nodes.values():  # rebuilt by redis-py with its class
        node.connection_class = connection_class


REFRESHES_IN_PLACE: Final = hasattr(RedisCluster, "_request_refresh")
"""Whether redis-py re-reads a cluster's slot map in place (8.2 on), rather than by closing the
whole client, connections in use included (before 8.2)."""


async def close_cluster(client: RedisCluster, full_close: Callable[[], Awaitable[None]]) -> bool:
    """Close ``client`` for its owner, or, when redis-py closes it itself, gently; whether fully.

    Before 8.2 redis-py calls ``aclose()`` itself to force a new read of the slot map (after
    ``CLUSTERDOWN`` during a failover, and after a run of ``MOVED``), and its close
    disconnects every connection of every node, including those other tasks are writing on
    or blocked reading from: they fail with an ``AttributeError`` from inside redis-py (seen
    killing a worker in the failover test). There a close marks connections in use to be
    dropped when their command ends and drops the idle ones at once; the slot map is read
    again on the next command. From 8.2 on only the owner closes, with ``full_close``
    (redis-py's own ``aclose``), which leaves nothing for ``__del__`` to warn about.
    """
    if REFRESHES_IN_PLACE:
        await full_close()
        return True
    client._initialize = True
    for nodes in (client.nodes_manager.nodes_cache, client.nodes_manager.startup_nodes):
        for node in list(nodes.values()):
            node.update_active_connections_for_reconnect()
            await node.disconnect_free_connections()
    return False


def node_of_slot(client: RedisCluster, slot: int) -> ClusterNode:
    """The master serving ``slot`` as ``client`` last read the slot map."""
    return client.nodes_manager.get_node_from_slot(slot)


async def reread_slot_map(client: RedisCluster) -> None:
    """Read the slot map again now (a replica may have taken over a lost master)."""
    await client.nodes_manager.initialize()
