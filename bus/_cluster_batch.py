"""A batch of calls over several partitions on a Redis Cluster: one write per master.

Every key of one partition shares one hash tag, so each script call is a single-slot
command; a batch (``bus.lowlevel.run_batch``) of calls for several partitions is split by
the master of each call's slot, computed here from the call's first key (redis-py would ask
a node, ``COMMAND GETKEYS``, for every ``FCALL``: one round trip per call):

- each master's calls go as one lean write (``bus/_connection.py``, a single-server client
  per master), the masters side by side; over TLS, redis-py's cluster pipeline instead;
- calls the lean write could not place (the master was lost, ``MOVED``, ``ASK``,
  ``TRYAGAIN`` mid-move, ``CLUSTERDOWN`` mid-failover) go through redis-py's cluster
  pipeline, which follows redirections and re-reads the slot map; one that met a lost node
  is sent again after a back-off, as often as the client retries (every batch redsaga sends
  is safe to repeat, see :func:`bus._connection.send_batch`);
- ``FUNCTION LOAD`` goes to every master (a function must be loaded where its keys live):
  "loaded" when one master loaded it, "exists" when all had it;
- ``WAIT`` ends each master's write, on the connection that wrote (``WAIT`` counts the
  replicas that have that connection's writes); its reply is the fewest replicas any master
  acknowledged, so a batch is acknowledged only when every master's writes are.

A transaction (``MULTI``) cannot span slots and redis-py's async cluster pipeline has none:
what must be atomic is one script.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from redis import exceptions as rx
from redis.asyncio.cluster import RedisCluster

from bus._backoff import Backoff
from bus._clock import SystemClock
from bus._cluster import ClusterClient, primaries
from bus._errors import LibraryExists, translate
from bus._redispy import node_of_slot, reread_slot_map

_RETRYABLE: Final = (*RedisCluster.ERRORS_ALLOW_RETRY, rx.TryAgainError, rx.MasterDownError)
_REDIRECTED: Final = (rx.AskError, rx.TryAgainError, rx.ClusterDownError)  # MovedError is an AskError
_SCRIPT_CALLS: Final = frozenset({b"FCALL", b"FCALL_RO", b"EVALSHA", b"EVAL"})
Command = tuple[Any, ...]


async def send_cluster_batch(client: RedisCluster, commands: Sequence[Command]) -> list[Any]:
    """Run ``commands`` on the masters that own their slots; replies (errors in place) in order."""
    if isinstance(client, ClusterClient):
        async with client.held():
            return await _send(client, commands)
    return await _send(client, commands)


async def _send(client: RedisCluster, commands: Sequence[Command]) -> list[Any]:
    waits = [index for index, args in enumerate(commands) if _name(args) == b"WAIT"]
    batch = _Batch(client, commands, commands[waits[-1]] if waits else None)
    keyed: list[int] = []
    for index, args in enumerate(commands):
        if _name(args) == b"FUNCTION" and _word(args, 1) == b"LOAD":
            batch.replies[index] = await _load_on_primaries(client, args)
        elif _name(args) != b"WAIT":
            keyed.append(index)
    if isinstance(client, ClusterClient) and client.lean_options is not None:
        keyed = await batch.lean(client, keyed)
    await batch.redis_py(keyed)
    for index in waits:
        batch.replies[index] = batch.fewest_acks(commands[index])
    return batch.replies


@dataclass
class _Batch:
    """One batch's commands, their replies as they come, and the ``WAIT`` replies per master."""

    client: RedisCluster
    commands: Sequence[Command]
    wait: Command | None
    replies: list[Any] = field(default_factory=list)
    acks: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.replies = [None] * len(self.commands)

    def fewest_acks(self, wait: Command) -> Any:
        """The ``WAIT`` reply of the batch: an error if one master's failed, else the fewest acks."""
        if not self.acks:
            return int(wait[1])  # nothing written: nothing to wait for
        errors = [ack for ack in self.acks if isinstance(ack, BaseException)]
        return errors[0] if errors else min(self.acks)

    async def lean(self, client: ClusterClient, todo: list[int]) -> list[int]:
        """Each master's calls as one lean write, the masters side by side; the calls left over.

        Left over for redis-py's path: calls whose master was lost (connection error), that
        were redirected or met a failover, and commands without a key.
        """
        # imported here: bus._connection imports this module
        from bus._connection import send_batch  # noqa: PLC0415

        await primaries(client)
        rest: list[int] = []
        groups: dict[str, list[int]] = {}
        for index in todo:
            key = _key_of(self.commands[index])
            try:
                node = None if key is None else node_of_slot(client, client.keyslot(key))
            except rx.SlotNotCoveredError:
                node = None
            if node is None:
                rest.append(index)
            else:
                groups.setdefault(node.name, []).append(index)
        tail = [self.wait] if self.wait else []
        writes = [
            send_batch(client.lean(node), [*(self.commands[i] for i in group), *tail])
            for node, group in groups.items()
        ]
        for group, result in zip(
            groups.values(), await asyncio.gather(*writes, return_exceptions=True), strict=True
        ):
            if isinstance(result, rx.ConnectionError | rx.TimeoutError):
                rest += group
                continue
            if isinstance(result, BaseException):
                raise result
            if self.wait:
                self.acks.append(result.pop())
            for index, reply in zip(group, result, strict=True):
                if isinstance(reply, _REDIRECTED):
                    rest.append(index)
                else:
                    self.replies[index] = reply
        return sorted(rest)

    async def redis_py(self, todo: list[int]) -> None:
        """redis-py's cluster pipeline for ``todo``; calls that met a lost node are sent again."""
        client = self.client
        # the transport's own retry, as redis-py's: real time, not the engine's injected clock
        backoff = Backoff(SystemClock(), cap_s=1.0)
        for attempt in range(client.retry.get_retries() + 1):
            if not todo:
                return
            try:
                pipe, waited = await _routed(client, [self.commands[index] for index in todo], self.wait)
                results = await pipe.execute(raise_on_error=False)
            except _RETRYABLE as error:
                results, waited = [error] * len(todo), 0
            if waited:
                self.acks += [ack for ack in results[len(todo) :] if not isinstance(ack, _RETRYABLE)]
            for index, result in zip(todo, results, strict=False):
                self.replies[index] = result
            todo = [index for index in todo if isinstance(self.replies[index], _RETRYABLE)]
            if todo and attempt < client.retry.get_retries():
                await backoff.wait()
                await _reread_slots(client)
        for index in todo:  # still failing: the node is gone for now, like a lost single server
            raise self.replies[index]


async def _routed(client: RedisCluster, commands: Sequence[Command], wait: Command | None) -> tuple[Any, int]:
    """A cluster pipeline of ``commands``, each to the master of its key's slot; how many ``WAIT`` s.

    With ``wait``, a ``WAIT`` ends each master's part of the pipeline (its last command there).
    """
    await primaries(client)
    pipe = client.pipeline(transaction=False)
    nodes = {}
    for args in commands:
        key = _key_of(args)
        if key is None:
            pipe.execute_command(*args)
        else:
            node = node_of_slot(client, client.keyslot(key))
            nodes[node.name] = node
            pipe.execute_command(*args, target_nodes=node)
    if wait is None:
        return pipe, 0
    for node in nodes.values():
        pipe.execute_command(*wait, target_nodes=node)
    return pipe, len(nodes)


async def _reread_slots(client: RedisCluster) -> None:
    """Re-read the slot map (a replica may have taken over a lost master)."""
    try:
        await reread_slot_map(client)
    except (rx.RedisError, rx.RedisClusterException):
        return  # no node answers yet: the next attempt tries again


async def _load_on_primaries(client: RedisCluster, args: Command) -> Any:
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


def _key_of(args: Command) -> Any:
    """The first key of a command (scripts: after the key count), or ``None``."""
    if _name(args) in _SCRIPT_CALLS:
        return args[3] if int(args[2]) > 0 else None
    return args[1] if len(args) > 1 else None


def _name(args: Command) -> bytes:
    return _word(args, 0)


def _word(args: Command, index: int) -> bytes:
    if len(args) <= index:
        return b""
    word = args[index]
    if isinstance(word, str):
        return word.upper().encode()
    return word.upper() if isinstance(word, bytes) else b""
