"""Handler slots: the bounded pool that turns free capacity into read sizes (backpressure).

Readers and the reclaimer share one pool. A blocking XREADGROUP must hold the slots for the
entries it may receive, so two rules keep every loop served:

- reservations are first come, first served: once a loop waits, a later caller queues
  behind it even if slots are free, and released slots go to the oldest waiter first;
- a blocking reader takes at most its share of the pool (see ``Runtime.reader_share``),
  so one idle stream's reader cannot hold every slot while the others wait.

Without them a reader that releases its slots after an empty ``BLOCK`` and reserves them
again at once starves every other reader and the reclaimer (entries of dead consumers were
never taken over while the worker was idle).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class _Waiter:
    most: int
    granted: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)


class Slots:
    """A fair counting pool of handler slots shared by every reader of a worker."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._waiters: deque[_Waiter] = deque()
        self._changed: asyncio.Event | None = None  # made only while someone waits for it

    async def reserve(self, most: int) -> int:
        """Wait for a free slot (in arrival order), then take up to ``most``; return how many."""
        if self.free and not self._waiters:
            taken = min(self.free, most)
            self.free -= taken
            return taken
        waiter = _Waiter(most)
        self._waiters.append(waiter)
        try:
            await waiter.ready.wait()
        except BaseException:
            if waiter.ready.is_set():
                self.release(waiter.granted)  # granted while being cancelled: hand it on
            else:
                self._waiters.remove(waiter)
            raise
        return waiter.granted

    def release(self, count: int = 1) -> None:
        """Give ``count`` slots back; the oldest waiters get them first."""
        if not count:
            return
        self.free += count
        while self.free and self._waiters:
            waiter = self._waiters.popleft()
            waiter.granted = min(self.free, waiter.most)
            self.free -= waiter.granted
            waiter.ready.set()
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait_all_free(self) -> None:
        """Wait until no slot is in use (every handled entry has been settled)."""
        while self.free < self.total:
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()

    @property
    def busy(self) -> int:
        """Slots in use."""
        return self.total - self.free
