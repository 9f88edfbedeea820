"""Concurrent calls from callers without a worker (clients) share pipelined round trips.

A round trip costs far more client CPU than one more command in a pipeline (redis-py's
per-command path, and a socket write that on loopback runs Redis's receive path), so
concurrent ``SagaClient.start`` calls in one process are sent together. There is no task
to start or stop: a call made while nothing is in flight starts a sender task that sends
whatever is queued, round after round, and ends when the queue is empty. A lone call costs
one event-loop turn more than a direct call.

Nothing is retried here (redis-py's own retries apply, as for a direct call): a connection
failure fails every call of its round with :class:`~bus.RedisUnavailable`. A cancelled
caller only stops waiting; its call, once queued, is sent like the others.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bus._client import Redis
from bus._errors import BusError
from bus._scripts import Call, ReplicaAcks, run_batch

MAX_BATCH = 256
"""Most calls in one pipeline: a burst of starts goes in several round trips, so no single
one holds Redis (or this event loop) for long."""


class Batcher:
    """Sends the calls made at the same time in one pipeline."""

    def __init__(self, redis: Redis, *, acks: ReplicaAcks | None = None) -> None:
        self._redis = redis
        self._acks = acks
        self._queue: list[tuple[Call, asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def call(self, call: Call) -> Any:
        """Send ``call`` with the others made meanwhile; return its result (raise its error)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._queue.append((call, done))
        if self._sender is None:
            self._sender = loop.create_task(self._send())
        result = await done
        if isinstance(result, BusError):
            raise result
        return result

    async def _send(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                try:
                    results: list[Any] = await run_batch(
                        self._redis, [call for call, _ in batch], acks=self._acks
                    )
                except BusError as error:
                    results = [error] * len(batch)
                except Exception as error:  # noqa: BLE001 - a bug: every waiting caller sees it
                    for _, done in batch:
                        if not done.done():
                            done.set_exception(error)
                    continue
                except BaseException:  # cancelled (the event loop is closing): so are the callers
                    for _, done in batch + self._queue:
                        done.cancel()
                    self._queue = []
                    raise
                for (_, done), result in zip(batch, results, strict=True):
                    if not done.done():  # its caller stopped waiting
                        done.set_result(result)
        finally:
            self._sender = None
