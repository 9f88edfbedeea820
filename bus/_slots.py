"""Handler slots: the bounded pool that turns free capacity into read sizes (backpressure)."""

from __future__ import annotations

import anyio


class Slots:
    """A counting pool of handler slots shared by every reader of a worker."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._released = anyio.Event()

    async def reserve(self, most: int) -> int:
        """Wait for a free slot, then take up to ``most`` of the free slots; return how many."""
        while self.free == 0:
            await self._released.wait()
        taken = min(self.free, most)
        self.free -= taken
        return taken

    def release(self, count: int = 1) -> None:
        """Give ``count`` slots back and wake waiting readers."""
        self.free += count
        if count:
            self._released.set()
            self._released = anyio.Event()

    async def wait_all_free(self) -> None:
        """Wait until no slot is in use (every handled entry has been settled)."""
        while self.free < self.total:
            await self._released.wait()

    @property
    def busy(self) -> int:
        """Slots in use."""
        return self.total - self.free
