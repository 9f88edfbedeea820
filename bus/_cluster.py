"""Redis Cluster: the client for ``redis+cluster://`` URLs and the slot-aware batch.

``redis+cluster://[user:password@]host:port[,host:port…][?option=value…]`` (and
``rediss+cluster://`` for TLS) names some of a cluster's nodes; redis-py's
:class:`~redis.asyncio.cluster.RedisCluster` learns the rest (``CLUSTER SLOTS``), routes each
command by the slot of its key, follows ``MOVED`` and ``ASK`` and re-reads the topology after
a failover. Every key of one partition shares one hash tag, so each script call is a
single-slot command, and a batch of calls for several partitions is split by node here:

- keyed commands go through one non-transactional cluster pipeline, which sends one write
  per node (redis-py groups them) and re-sends a redirected command to its new owner;
- ``FUNCTION LOAD`` goes to every master (a function must be loaded where its keys live);
  its reply is "loaded" when one master loaded it, "exists" when all had it;
- ``WAIT`` goes to each master the batch wrote to; its reply is the fewest replicas any
  of them acknowledged, so a batch is acknowledged only when every node's writes are;
- a command that met a lost node (connection refused, ``CLUSTERDOWN`` during a failover)
  is sent again after the slot map is re-read, as often as the client retries; every
  batch redsaga sends is safe to repeat (see :func:`bus._connection.send_batch`).

A transaction (``MULTI``) cannot span slots and redis-py's async cluster pipeline has none:
what must be atomic is one script.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, Final, cast
from urllib.parse import urlsplit, urlunsplit

from redis import exceptions as rx
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection, parse_url
from redis.crc import key_slot

from bus._errors import LibraryExists, translate

CLUSTER_SCHEMES: Final = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""Cluster URL schemes and the plain scheme of each (TLS or not)."""
_RETRYABLE: Final = (*RedisCluster.ERRORS_ALLOW_RETRY, rx.TryAgainError, rx.MasterDownError)
_SCRIPT_CALLS: Final = frozenset({b"FCALL", b"FCALL_RO", b"EVALSHA", b"EVAL"})


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
    connection_class = _GuardedSSLConnection if kwargs.get("ssl") else _GuardedConnection
    client = ClusterClient(startup_nodes=[ClusterNode(host, port) for host, port in nodes], **kwargs)
    client.nodes_manager.connection_kwargs["connection_class"] = connection_class  # nodes found later
    for node in client.nodes_manager.startup_nodes.values():  # rebuilt by redis-py with its class
        node.connection_class = connection_class
    return client


class _Guarded(Connection):
    """A connection whose write fails as a lost link when another task dropped it meanwhile.

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


class _GuardedConnection(_Guarded):
    """:class:`_Guarded` over TCP."""


class _GuardedSSLConnection(_Guarded, SSLConnection):
    """:class:`_Guarded` over TLS."""


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

    async def aclose(self) -> None:
        """Drop idle connections now and busy ones when released; re-read the slot map on next use."""
        self._initialize = True
        for nodes in (self.nodes_manager.nodes_cache, self.nodes_manager.startup_nodes):
            for node in list(nodes.values()):
                node.update_active_connections_for_reconnect()
                await node.disconnect_free_connections()


def _host_port(entry: str) -> tuple[str, int]:
    host, _, port = entry.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a cluster URL lists host:port entries, got {entry!r}")
    return host, int(port)


def is_cluster(client: object) -> bool:
    """Whether ``client`` is a Redis Cluster client."""
    return isinstance(client, RedisCluster)


async def primaries(client: Any) -> list[ClusterNode]:
    """The masters of ``client``'s cluster as it last read the slot map (read now if never)."""
    cluster = cast("RedisCluster", client)
    if not cluster.get_primaries():
        await cluster.initialize()
    return cluster.get_primaries()


async def send_cluster_batch(client: RedisCluster, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Run ``commands`` on the nodes that own their slots; replies (errors in place) in order."""
    if isinstance(client, ClusterClient):
        async with client.held():
            return await _send(client, commands)
    return await _send(client, commands)


async def _send(client: RedisCluster, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    replies: list[Any] = [None] * len(commands)
    keyed: list[int] = []
    for index, args in enumerate(commands):
        if _name(args) == b"FUNCTION" and _word(args, 1) == b"LOAD":
            replies[index] = await _load_on_primaries(client, args)
        elif _name(args) != b"WAIT":
            keyed.append(index)
    await _run_keyed(client, commands, keyed, replies)
    for index, args in enumerate(commands):
        if _name(args) == b"WAIT":
            replies[index] = await _wait_on(client, args, [commands[i] for i in keyed])
    return replies


async def _run_keyed(
    client: RedisCluster, commands: Sequence[tuple[Any, ...]], todo: list[int], replies: list[Any]
) -> None:
    """One cluster pipeline for ``todo``; commands that met a lost node are sent again."""
    for attempt in range(client.retry.get_retries() + 1):
        if not todo:
            return
        try:
            pipe = await _routed(client, [commands[index] for index in todo])
            results = await pipe.execute(raise_on_error=False)
        except _RETRYABLE as error:
            results = [error] * len(todo)
        for index, result in zip(todo, results, strict=True):
            replies[index] = result
        todo = [index for index in todo if isinstance(replies[index], _RETRYABLE)]
        if todo and attempt < client.retry.get_retries():
            await _reread_slots(client, attempt)
    for index in todo:  # still failing: the node is gone for now, like a lost single server
        raise replies[index]


async def _routed(client: RedisCluster, commands: Sequence[tuple[Any, ...]]) -> Any:
    """A cluster pipeline of ``commands``, each sent to the master of its key's slot.

    The slot is computed here from the key (a script's first key after its key count):
    redis-py would ask a node (``COMMAND GETKEYS``) for every ``FCALL``, one round trip per
    call, to a node that may be the one just lost. A redirected command (``MOVED``, ``ASK``)
    is re-sent by redis-py to its new owner.
    """
    await primaries(client)
    pipe = client.pipeline(transaction=False)
    for args in commands:
        key = _key_of(args)
        if key is None:
            pipe.execute_command(*args)
        else:
            node = client.nodes_manager.get_node_from_slot(client.keyslot(key))
            pipe.execute_command(*args, target_nodes=node)
    return pipe


async def _reread_slots(client: RedisCluster, attempt: int) -> None:
    """Back off, then re-read the slot map (a replica may have taken over a lost master)."""
    await asyncio.sleep(min(0.05 * 2**attempt, 1.0))  # reconnect back-off, as redis-py's own retry
    try:
        await client.nodes_manager.initialize()
    except (rx.RedisError, rx.RedisClusterException):
        return  # no node answers yet: the next attempt tries again


async def _load_on_primaries(client: RedisCluster, args: tuple[Any, ...]) -> Any:
    outcomes = await asyncio.gather(
        *(client.execute_command(*args, target_nodes=node) for node in await primaries(client)),
        return_exceptions=True,
    )
    errors = [o for o in outcomes if isinstance(o, rx.RedisError)]
    failures = [e for e in errors if not isinstance(translate(e), LibraryExists)]
    if failures:
        return failures[0]
    if len(errors) == len(outcomes):
        return errors[0]  # every master had it
    return next(o for o in outcomes if not isinstance(o, BaseException))


async def _wait_on(client: RedisCluster, args: tuple[Any, ...], written: list[tuple[Any, ...]]) -> Any:
    nodes = {node.name: node for node in (_node_of(client, command) for command in written) if node}
    if not nodes:
        return int(args[1])  # nothing written: nothing to wait for
    counts = await asyncio.gather(
        *(client.execute_command(*args, target_nodes=node) for node in nodes.values()),
        return_exceptions=True,
    )
    for count in counts:
        if isinstance(count, BaseException):
            return count
    return min(cast("list[int]", counts))


def _node_of(client: RedisCluster, args: tuple[Any, ...]) -> ClusterNode | None:
    key = _key_of(args)
    return None if key is None else client.get_node_from_key(key)


def _key_of(args: tuple[Any, ...]) -> Any:
    """The first key of a command (scripts: after the key count), or ``None``."""
    if _name(args) in _SCRIPT_CALLS:
        return args[3] if int(args[2]) > 0 else None
    return args[1] if len(args) > 1 else None


def _name(args: tuple[Any, ...]) -> bytes:
    return _word(args, 0)


def _word(args: tuple[Any, ...], index: int) -> bytes:
    if len(args) <= index:
        return b""
    word = args[index]
    if isinstance(word, str):
        return word.upper().encode()
    return word.upper() if isinstance(word, bytes) else b""


def slot_of(key: str) -> int:
    """The cluster slot of ``key`` (CRC16 of its hash tag, mod 16384), as Redis computes it."""
    return int(key_slot(key.encode()))


def owner_of(client: Any, slot: int) -> str:
    """``host:port`` of the master serving ``slot`` as ``client`` last read the slot map."""
    return str(cast("RedisCluster", client).nodes_manager.get_node_from_slot(slot).name)
