"""Exponential back-off with jitter for loops that wait out a Redis outage."""

from __future__ import annotations

import random

from bus._clock import Clock

_JITTER = random.Random()
"""The default source of jitter: seeding a ``Random`` reads the OS entropy pool (~20 µs), and
the completer makes a back-off per flush, so instances share one."""


class Backoff:
    """Waits 50 ms, 100 ms, … up to ``cap_s``, each scaled by a random factor in [0.5, 1]."""

    def __init__(self, clock: Clock, *, cap_s: float = 5.0, rng: random.Random | None = None) -> None:
        self._clock = clock
        self._cap_s = cap_s
        self._rng = rng or _JITTER
        self._next_s = 0.05

    def reset(self) -> None:
        """Start again from the shortest wait (after a success)."""
        self._next_s = 0.05

    async def wait(self) -> None:
        """Sleep the next back-off interval on the injected clock."""
        await self._clock.sleep(min(self._next_s, self._cap_s) * self._rng.uniform(0.5, 1.0))
        self._next_s = min(self._next_s * 2, self._cap_s)
