"""Batches the calls that end deliveries into one pipeline per flush (one round trip).

Calls submitted as :class:`~bus._scripts.BatchPart` are merged, per script, stream and
group, into one script call of at most ``MAX_PARTS`` parts, so a flush of a hundred
completions is one pipeline holding one script call rather than a hundred.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from bus._backoff import Backoff
from bus._client import Redis
from bus._clock import Clock
from bus._errors import BusError, RedisUnavailable
from bus._log import get_logger
from bus._scripts import BatchPart, CommandCall, ScriptCall, merge, run_batch
from bus._tally import Buckets

Callback = Callable[[Any], None]
Call = ScriptCall | CommandCall | BatchPart
_Queued = tuple[Call, Callback, bool]
MAX_PARTS = 128
_log = get_logger("redsaga.bus")


class Completer:
    """Collects script calls from many handlers and sends them together.

    While one pipeline is in flight, new calls queue up and go in the next one, so batches
    grow with load and a lone call is sent at once. A connection failure keeps the batch and
    retries it with back-off: every call is idempotent and fenced, so a repeat is harmless.
    Calls queued with ``retry=False`` (reads, claims whose caller handles the failure) get
    the :class:`~bus.RedisUnavailable` error instead.
    """

    def __init__(self, redis: Redis, clock: Clock) -> None:
        self._redis = redis
        self._clock = clock
        self._queue: list[_Queued] = []
        # asyncio primitives, not anyio's: the bus runs on asyncio only (redis-py), and an
        # anyio Event costs a backend lookup per construction, several per delivery here.
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sending = asyncio.Lock()
        self.round_trips: Buckets | None = None
        """Set (by ``bus/_metrics.py``) to time every pipeline's round trip."""

    def submit(self, call: Call, callback: Callback, *, retry: bool = True) -> None:
        """Queue ``call``; ``callback`` receives its result (or its :class:`BusError`).

        A :class:`~bus._scripts.BatchPart`'s result is its own element of the merged reply.
        """
        self._queue.append((call, callback, retry))
        self._idle.clear()
        self._wake.set()

    async def call(self, call: ScriptCall | CommandCall, *, retry: bool = True) -> Any:
        """Queue ``call``, wait for its batch, and return its result (raise its error)."""
        [result] = await self.call_many([call], retry=retry)
        if isinstance(result, BusError):
            raise result
        return result

    async def call_many(self, calls: Sequence[ScriptCall | CommandCall], *, retry: bool = True) -> list[Any]:
        """Queue ``calls`` together and return their results in order, errors included.

        One wait for the lot (a batch handler's commits): a failed call's result is its
        :class:`BusError`, returned rather than raised.
        """
        if not calls:
            return []
        results: list[Any] = [None] * len(calls)
        left = len(calls)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def finished(index: int, result: Any) -> None:
            nonlocal left
            results[index] = result
            left -= 1
            if left == 0 and not done.done():
                done.set_result(None)

        for index, call in enumerate(calls):
            self.submit(call, functools.partial(finished, index), retry=retry)
        await done
        return results

    @property
    def pending(self) -> int:
        """Calls queued and not yet sent."""
        return len(self._queue)

    async def wait_idle(self) -> None:
        """Wait until every queued call has been sent and its callback run."""
        await self._idle.wait()

    async def run(self) -> None:
        """Flush forever; cancel to stop (call :meth:`flush` first to send what is queued)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Send everything queued now (after any batch in flight), retrying with back-off."""
        async with self._sending:
            await self._send_queued()

    async def _send_queued(self) -> None:
        backoff = Backoff(self._clock)
        while self._queue:
            batch, self._queue = self._queue, []
            calls, members = _plan(batch)
            sent = time.perf_counter()
            try:
                replies = await run_batch(self._redis, calls)
            except RedisUnavailable as error:
                kept = [item for item in batch if item[2]]
                _deliver([item for item in batch if not item[2]], [error] * (len(batch) - len(kept)))
                if kept:
                    _log.warning("completion batch not sent; retrying", error=str(error), calls=len(kept))
                    self._queue = kept + self._queue
                    await backoff.wait()
                continue
            except BusError as error:
                replies = [error] * len(calls)
            if self.round_trips is not None:
                self.round_trips.observe(time.perf_counter() - sent)
            results: list[Any] = [None] * len(batch)
            for reply, (merged, indexes) in zip(replies, members, strict=True):
                if not merged or isinstance(reply, BusError):
                    for index in indexes:
                        results[index] = reply
                else:
                    for index, result in zip(indexes, reply, strict=True):
                        results[index] = result
            _deliver(batch, results)
        self._idle.set()


def _deliver(batch: list[_Queued], results: list[Any]) -> None:
    for (_, callback, _), result in zip(batch, results, strict=True):
        try:
            callback(result)
        except Exception:  # noqa: BLE001 - a bug in one callback must not stop every completion
            _log.exception("completion callback failed")


def _plan(batch: list[_Queued]) -> tuple[list[ScriptCall | CommandCall], list[tuple[bool, list[int]]]]:
    """The calls to send for ``batch``, and for each the batch indexes it answers."""
    calls: list[ScriptCall | CommandCall] = []
    members: list[tuple[bool, list[int]]] = []
    groups: dict[Any, list[int]] = {}
    for index, (call, _, _) in enumerate(batch):
        if isinstance(call, BatchPart):
            groups.setdefault(call.merge_key, []).append(index)
        else:
            calls.append(call)
            members.append((False, [index]))
    for indexes in groups.values():
        for start in range(0, len(indexes), MAX_PARTS):
            chunk = indexes[start : start + MAX_PARTS]
            parts = [batch[i][0] for i in chunk]
            calls.append(merge([p for p in parts if isinstance(p, BatchPart)]))
            members.append((True, chunk))
    return calls, members
