"""The lean pipeline: a batch of commands in one write, every reply read back in step.

The connection and pool it runs on (and every redis-py internal they use) are in
:mod:`bus._redispy`; this module uses only what that adapter gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from redis.exceptions import ResponseError

from bus._cluster import is_cluster
from bus._cluster_batch import send_cluster_batch
from bus._redispy import LeanConnection, LeanPool

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster


def is_lean(client: Redis) -> bool:
    """Whether ``client`` was built by :func:`bus.connect` for a real server (lean paths apply)."""
    return _lean_pool(client) is not None


def _lean_pool(client: object) -> LeanPool | None:
    """The pool of lean connections of a client :func:`bus.connect` built for one server."""
    pool = getattr(client, "connection_pool", None)
    return pool if type(pool) is LeanPool and pool.lean_connections else None


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
    pool = _lean_pool(client)
    if pool is None:
        if is_cluster(client):
            if not parse:
                raise TypeError("raw replies need a client built by bus.connect for a single server")
            return await send_cluster_batch(cast("RedisCluster", client), commands)
        if not parse:
            raise TypeError("raw replies need a client built by bus.connect for a real server")
        return await _redis_py_pipeline(client, commands)
    connection = pool.take() or await pool.get_connection()
    try:
        try:
            replies: list[Any] = await connection.exchange(commands)
        except Exception as error:  # noqa: BLE001 - redis-py's retry policy decides, as below
            replies = await _retried(connection, commands, error)
    finally:
        if not pool.give_back(connection):
            await pool.release(connection)
    if parse:
        callbacks = client.response_callbacks
        for index, (args, reply) in enumerate(zip(commands, replies, strict=True)):
            callback = callbacks.get(args[0])
            if callback is not None and not isinstance(reply, ResponseError):
                replies[index] = callback(reply)
    return replies


async def _retried(
    connection: LeanConnection, commands: Sequence[tuple[Any, ...]], error: Exception
) -> list[Any]:
    """The batch under the connection's retry policy, its first attempt having raised ``error``.

    The first attempt is made outside the policy (it costs a few calls a batch that almost
    never fail); here the policy sees that attempt's error as its own first failure, so it
    retries, backs off and gives up exactly as if it had made it.
    """
    first: list[Exception] = [error]

    async def attempt() -> list[Any]:
        if first:
            raise first.pop()
        return await connection.exchange(commands)

    replies: list[Any] = await connection.retry.call_with_retry(
        attempt, lambda _error: connection.disconnect()
    )
    return replies


async def _redis_py_pipeline(client: Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        for args in commands:
            pipe.execute_command(*args)
        return await pipe.execute(raise_on_error=False)
