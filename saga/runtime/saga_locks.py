"""One lock per saga id, so that this process decides a saga's entries one at a time.

A saga with many branches gets many replies at once; deciding them side by side would only
lose revision races (workers in other processes still race, and the revision check makes the
loser decide again). A lock lives while someone holds or waits for it, so the table holds
only the sagas being decided.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class SagaLocks:
    """The locks of the sagas being decided in this process."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def holding(self, saga_ids: list[str]) -> AsyncIterator[None]:
        """Hold the lock of every saga in ``saga_ids`` (sorted: two rounds cannot deadlock).

        An asyncio lock, not anyio's: that one yields to the loop even when it is free.
        """
        locks: list[asyncio.Lock] = []
        for saga_id in saga_ids:
            lock, users = self._locks.get(saga_id) or (asyncio.Lock(), 0)
            self._locks[saga_id] = (lock, users + 1)
            locks.append(lock)
        held = 0
        try:
            for lock in locks:
                await lock.acquire()
                held += 1
            yield
        finally:
            for lock in locks[:held]:
                lock.release()
            for saga_id in saga_ids:
                lock, users = self._locks[saga_id]
                if users == 1:
                    del self._locks[saga_id]
                else:
                    self._locks[saga_id] = (lock, users - 1)
