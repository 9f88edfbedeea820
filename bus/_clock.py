"""The one clock the bus and the engine read; tests inject :class:`FakeClock`."""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Protocol

import anyio


class Clock(Protocol):
    """Wall time for records and timers, and the waits between loop iterations."""

    def now_ms(self) -> int:
        """Return Unix time in milliseconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...

    def script_now_ms(self) -> int:
        """The time Lua scripts judge timers by: ``-1`` means the Redis server's clock."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        """Return the system's Unix time in milliseconds."""
        return time.time_ns() // 1_000_000

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of real time."""
        await anyio.sleep(seconds)

    def script_now_ms(self) -> int:
        """``-1``: scripts use Redis ``TIME``, the one clock every worker shares."""
        return -1


class FakeClock:
    """A clock that moves only when a test calls :meth:`advance`.

    Sleepers wake in deadline order as time passes them; nothing waits on real time.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = start_ms
        self._sleepers: list[tuple[int, int, anyio.Event]] = []
        self._order = itertools.count()

    def now_ms(self) -> int:
        """Return the fake Unix time in milliseconds."""
        return self._now_ms

    def script_now_ms(self) -> int:
        """The fake time: scripts judge timers by it too, so tests control every clock."""
        return self._now_ms

    async def sleep(self, seconds: float) -> None:
        """Wait until :meth:`advance` moves the clock ``seconds`` forward."""
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        wake = anyio.Event()
        heapq.heappush(self._sleepers, (self._now_ms + int(seconds * 1000), next(self._order), wake))
        await wake.wait()

    def advance(self, seconds: float = 0, *, ms: int = 0) -> None:
        """Move the clock forward and wake every sleeper whose deadline has passed."""
        self.set(self._now_ms + int(seconds * 1000) + ms)

    def set(self, now_ms: int) -> None:
        """Jump to ``now_ms`` (forwards or backwards) and wake the sleepers that are due."""
        self._now_ms = now_ms
        while self._sleepers and self._sleepers[0][0] <= now_ms:
            heapq.heappop(self._sleepers)[2].set()
