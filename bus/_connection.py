"""The lean pipeline: a batch of commands in one write, every reply read back in step.

The connection and pool it runs on (and every redis-py internal they use) are in
:mod:`bus._redispy`; this module uses only what that adapter gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from redis.exceptions import ResponseError

from bus._cluster import is_cluster
from bus._cluster_batch import send_cluster_batch
from bus._redispy import LeanConnection, is_lean_class

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster


def is_lean(client: Redis) -> bool:
    """Whether ``client`` was built by :func:`bus.connect` for a real server (lean paths apply)."""
    if is_cluster(client):
        return False
    return is_lean_class(client.connection_pool.connection_class)


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
    connection: LeanConnection, commands: Sequence[tuple[Any, ...]], callbacks: Mapping[Any, Any]
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
