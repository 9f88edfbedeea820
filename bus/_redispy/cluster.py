"""The cluster client's repairs: guarded node connections, a gentle close, the slot map (internals 5, 7-9).

See :mod:`bus._redispy` for the internals each use.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from redis import exceptions as rx
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection


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
