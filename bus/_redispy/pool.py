"""The pool's checkout and release without a coroutine when a connection is free (internals 6, 10).

See :mod:`bus._redispy` for the internals each use.
"""

from __future__ import annotations

from typing import Any, Final

from redis.asyncio.connection import BlockingConnectionPool

from bus._redispy.connection import is_lean_class

_ReleasedEvent: Any
_ReAuthListener: Any
try:
    from redis.event import AsyncAfterConnectionReleasedEvent as _ReleasedEvent
    from redis.event import AsyncReAuthConnectionListener as _ReAuthListener
except ImportError:  # pragma: no cover - tests/bus/test_redispy.py fails on such a redis-py
    _ReleasedEvent = _ReAuthListener = None

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
        self.lean_connections = is_lean_class(self.connection_class)
        """Whether the pool's connections have the lean paths (:class:`LeanConnection`)."""

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

    def take(self) -> Any | None:
        """A free connection that is ready (:meth:`LeanConnection.ready`) now, or ``None``.

        ``None`` when none is free, someone waits or the connection needs redis-py's checkout
        (to reconnect or to drop what is unread): the caller then awaits :meth:`get_connection`.
        """
        available = self._available_connections
        if not available or not self._uncontended():
            return None
        connection: Any = available[-1]
        if not connection.ready():
            return None
        available.pop()
        self._in_use_connections.add(connection)
        return connection

    def give_back(self, connection: Any) -> bool:
        """Give back a connection from :meth:`take` if that cannot wait; whether it was.

        ``False`` (nothing done): the caller awaits :meth:`release`.
        """
        if not self._uncontended() or getattr(connection, "_re_auth_token", None) is not None:
            return False
        should_reconnect = getattr(connection, "should_reconnect", None)
        if (should_reconnect is not None and should_reconnect()) or not _only_re_auth_listens(
            self._event_dispatcher
        ):
            return False
        self._in_use_connections.remove(connection)
        self._available_connections.append(connection)
        return True

    async def release(self, connection: Any) -> None:
        """Give ``connection`` back (redis-py's release when someone waits for one)."""
        if self.give_back(connection):
            return
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
