"""redis-py at arm's length: every use of its internals, in this one package.

redsaga's lean paths (a batch sent in one write with its replies read in one timeout, a pool
checkout and release without a coroutine when a connection is free) and its repairs of the
cluster client reach past redis-py's public API. They live in this package and nowhere else;
pyproject.toml bounds redis-py to the minor versions the suite has passed on, and
``tests/bus/test_redispy.py`` checks each internal below against the installed redis-py,
failing with its name when a release moves it.

Internals used (``redis.asyncio`` unless named otherwise):

1. ``Connection._parser``: with redis-py's hiredis parser (``redis._parsers.hiredis.
   _AsyncHiredisParser``), its hiredis reader ``_reader``, its stream ``_stream``, ``_read_size``,
   ``_connected``, ``handle_push_response()`` and the module's ``NOT_ENOUGH_DATA``: a batch's
   replies taken from the reader without the parser's calls per reply, and a connection's
   readiness checked without a coroutine (with the stream's ``_buffer``, which redis-py's own
   check reads too); with any other parser, ``read_response()``: one reply, without the
   timeout context that ``Connection.read_response`` opens per reply
   (:meth:`LeanConnection.read_replies`, :meth:`LeanConnection.ready`).
2. ``Connection._writer``: the stream the bytes go to, written without the task that
   ``send_packed_command`` starts per send (:meth:`LeanConnection.send_packed_command`,
   :class:`GuardedConnection`).
3. ``Connection._host_error()``: the server's name in redis-py's error messages.
4. ``Connection.next_health_check``: health-check bookkeeping after a read.
5. ``Connection._send_packed_command()``: the write a cluster node's connection makes
   (:class:`GuardedConnection`).
6. ``BlockingConnectionPool._available_connections``, ``_in_use_connections``,
   ``_condition``, ``_lock``, ``_event_dispatcher``, ``_in_maintenance`` and
   ``redis.event.AsyncAfterConnectionReleasedEvent``: the checkout and release without a
   wait (:class:`LeanPool`).
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

from bus._redispy.cluster import (
    REFRESHES_IN_PLACE,
    GuardedTCPConnection,
    GuardedTLSConnection,
    close_cluster,
    node_of_slot,
    reread_slot_map,
    use_cluster_connection_class,
)
from bus._redispy.connection import (
    LeanConnection,
    LeanTCPConnection,
    LeanTLSConnection,
    is_lean_class,
    lean_connection_class,
    pool_options,
)
from bus._redispy.pool import LeanPool

__all__ = [
    "REFRESHES_IN_PLACE",
    "GuardedTCPConnection",
    "GuardedTLSConnection",
    "LeanConnection",
    "LeanPool",
    "LeanTCPConnection",
    "LeanTLSConnection",
    "close_cluster",
    "is_lean_class",
    "lean_connection_class",
    "node_of_slot",
    "pool_options",
    "reread_slot_map",
    "use_cluster_connection_class",
]
