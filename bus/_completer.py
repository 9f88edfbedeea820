"""Batches the calls that end deliveries into one pipeline per flush (one round trip)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from bus._backoff import Backoff
from bus._client import Redis
from bus._clock import Clock
from bus._errors import BusError, RedisUnavailable
from bus._log import get_logger
from bus._scripts import ScriptCall, run_batch

Callback = Callable[[Any], None]
_log = get_logger("redsaga.bus")


class Completer:
    """Collects script calls from many handlers and sends them together.

    While one pipeline is in flight, new calls queue up and go in the next one, so batches
    grow with load and a lone call is sent at once. A connection failure keeps the batch and
    retries it with back-off: every call is idempotent and fenced, so a repeat is harmless.
    """

    def __init__(self, redis: Redis, clock: Clock) -> None:
        self._redis = redis
        self._clock = clock
        self._queue: list[tuple[ScriptCall, Callback]] = []
        self._wake = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._sending = anyio.Lock()

    def submit(self, call: ScriptCall, callback: Callback) -> None:
        """Queue ``call``; ``callback`` receives its result (or its :class:`BusError`)."""
        self._queue.append((call, callback))
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        self._wake.set()

    async def call(self, call: ScriptCall) -> Any:
        """Queue ``call``, wait for its batch, and return its result (raise its error)."""
        done = anyio.Event()
        box: list[Any] = []

        def finished(result: Any) -> None:
            box.append(result)
            done.set()

        self.submit(call, finished)
        await done.wait()
        if isinstance(box[0], BusError):
            raise box[0]
        return box[0]

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
            self._wake = anyio.Event()
            await self.flush()

    async def flush(self) -> None:
        """Send everything queued now (after any batch in flight), retrying with back-off."""
        async with self._sending:
            await self._send_queued()

    async def _send_queued(self) -> None:
        backoff = Backoff(self._clock)
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                results = await run_batch(self._redis, [call for call, _ in batch])
            except RedisUnavailable as error:
                _log.warning("completion batch not sent; retrying", error=str(error), calls=len(batch))
                self._queue = batch + self._queue
                await backoff.wait()
                continue
            except BusError as error:
                results = [error] * len(batch)
            for (_, callback), result in zip(batch, results, strict=True):
                try:
                    callback(result)
                except Exception:  # noqa: BLE001 - a bug in one callback must not stop every completion
                    _log.exception("completion callback failed")
        self._idle.set()
