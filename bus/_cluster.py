"""Redis Cluster: the client for ``redis+cluster://`` URLs.

``redis+cluster://[user:password@]host:port[,host:port…][?option=value…]`` (and
``rediss+cluster://`` for TLS) names some of a cluster's nodes; redis-py's
:class:`~redis.asyncio.cluster.RedisCluster` learns the rest (``CLUSTER SLOTS``), routes each
command by the slot of its key, follows ``MOVED`` and ``ASK`` and re-reads the topology after
a failover. :class:`ClusterClient` adds what a worker needs of it (a wait for a free
connection, a reset that never cuts a connection in use, a lean client per master); the
batch of calls over several partitions is ``bus/_cluster_batch.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, Final, cast
from urllib.parse import urlsplit, urlunsplit

from redis import exceptions as rx
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.connection import parse_url
from redis.crc import key_slot

from bus._redispy import (
    LeanPool,
    LeanTCPConnection,
    close_cluster,
    node_of_slot,
    use_cluster_connection_class,
)

CLUSTER_SCHEMES: Final = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""Cluster URL schemes and the plain scheme of each (TLS or not)."""


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def cluster_client(url: str, options: dict[str, Any]) -> RedisCluster:
    """A cluster client for ``url`` with ``options`` (timeouts, retry, name); no connection yet.

    Credentials, TLS and query options are parsed as redis-py parses a plain URL; every
    ``host:port`` of the URL is a startup node.
    """
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    nodes = [_host_port(entry) for entry in hosts.split(",") if entry]
    if not nodes:
        raise ValueError(f"a cluster URL names at least one host:port: {url!r}")
    plain = urlunsplit((CLUSTER_SCHEMES[parts.scheme], f"{userinfo}@{hosts.split(',')[0]}"
                        if userinfo else hosts.split(",")[0], parts.path, parts.query, ""))  # fmt: skip
    kwargs = {**options, **parse_url(plain)}
    for unused in ("host", "port", "db", "path", "connection_class"):
        kwargs.pop(unused, None)
    if CLUSTER_SCHEMES[parts.scheme] == "rediss":
        kwargs["ssl"] = True
    # redis-py's per-node pool does not wait for a free connection: the pool size is a cap
    kwargs.pop("timeout", None)
    client = ClusterClient(startup_nodes=[ClusterNode(host, port) for host, port in nodes], **kwargs)
    if not kwargs.get("ssl"):  # the lean connection is plain TCP; over TLS every batch takes redis-py's path
        auth = {k: kwargs[k] for k in ("username", "password") if kwargs.get(k) is not None}
        client.lean_options = {**options, **auth}
    use_cluster_connection_class(client, tls=bool(kwargs.get("ssl")))
    return client


_HOLDING: ContextVar[bool] = ContextVar("redsaga_cluster_gate", default=False)


class ClusterClient(RedisCluster):
    """redis-py's cluster client, waiting for a free connection and never cutting one in use.

    redis-py's per-node pool does not wait: past ``max_connections`` a command fails with
    ``MaxConnectionsError`` (a single server's pool waits, and a hundred concurrent starts
    are normal). Here every command and batch first takes one of ``max_connections`` slots
    (a task holding one takes no second: a redirected command re-sent inside a batch); a
    holder uses at most one connection per node, so no node's pool runs out.

    redis-py calls ``aclose()`` itself to force a new read of the slot map (after
    ``CLUSTERDOWN`` during a failover, and after a run of ``MOVED``), and its close
    disconnects every connection of every node, including those other tasks are writing on
    or blocked reading from: they fail with an ``AttributeError`` from inside redis-py (seen
    killing a worker in the failover test). Here a close marks connections in use to be
    dropped when their command ends and drops the idle ones at once; the slot map is read
    again on the next command. When nothing is in use (the owner closing the client at the
    end), every connection is closed at once, as before.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._gate = asyncio.Semaphore(self.nodes_manager.connection_kwargs.get("max_connections", 100))
        self.lean_options: dict[str, Any] | None = None
        """Options of the lean per-master clients (``None``: no lean path, e.g. over TLS)."""
        self._lean: dict[str, Any] = {}

    def lean(self, node: str) -> Any:
        """The lean single-server client of master ``node`` (``host:port``), made on first use."""
        client = self._lean.get(node)
        if client is None:
            host, _, port = node.rpartition(":")
            options = dict(self.lean_options or {})
            pool = LeanPool(connection_class=LeanTCPConnection, host=host, port=int(port), **options)
            client = self._lean[node] = Redis.from_pool(pool)
        return client

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Hold one of the client's slots (at once if this task holds one already)."""
        if _HOLDING.get():
            yield
            return
        async with self._gate:
            token = _HOLDING.set(True)
            try:
                yield
            finally:
                _HOLDING.reset(token)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """redis-py's, once a slot is free."""
        async with self.held():
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        """redis-py's cluster pipeline, whose ``execute`` holds a slot (one connection per node)."""
        if shard_hint:
            raise rx.RedisClusterException("shard_hint is deprecated in cluster mode")
        return _GatedPipeline(self, transaction)  # type: ignore[abstract]  # as concrete as redis-py's own

    async def aclose(self) -> None:
        """Close every connection (the owner's close), or only idle ones when redis-py closes it.

        Which of the two is redis-py's to decide (:func:`bus._redispy.close_cluster`): before
        8.2 it closes the client itself to re-read the slot map, and that close must not cut
        connections in use; the slot map is then read again on the next command.
        """
        fully = await close_cluster(self, super().aclose)
        for lean in self._lean.values():  # a busy one is closed by its own error
            await lean.connection_pool.disconnect(inuse_connections=fully)


class _GatedPipeline(ClusterPipeline):
    """A cluster pipeline that runs once its client has a free slot (see :class:`ClusterClient`)."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        """redis-py's, holding one of the client's slots."""
        client = cast("ClusterClient", self.cluster_client)
        async with client.held():
            return await super().execute(raise_on_error, allow_redirections)


def _host_port(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a cluster URL lists host:port entries, got {entry!r}")
    return host, int(port)


def is_cluster(client: object) -> bool:
    """Whether ``client`` is a Redis Cluster client."""
    kind = type(client)
    known = _cluster_types.get(kind)
    if known is None:
        known = _cluster_types[kind] = isinstance(client, RedisCluster)
    return known


# RedisCluster derives from a typing Protocol, so isinstance() runs typing's protocol check
# (~1.5 µs); the hot path asks once per batch sent, always about the same few client types.
_cluster_types: dict[type, bool] = {}


async def primaries(client: Any) -> list[ClusterNode]:
    """The masters of ``client``'s cluster as it last read the slot map (read now if never)."""
    cluster = cast("RedisCluster", client)
    if not cluster.get_primaries():
        await cluster.initialize()
    return cluster.get_primaries()


def slot_of(key: str) -> int:
    """The cluster slot of ``key`` (CRC16 of its hash tag, mod 16384), as Redis computes it."""
    return int(key_slot(key.encode()))


def owner_of(client: Any, slot: int) -> str:
    """``host:port`` of the master serving ``slot`` as ``client`` last read the slot map."""
    return str(node_of_slot(cast("RedisCluster", client), slot).name)
