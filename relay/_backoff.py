"""Capped exponential back-off with jitter, on the injected clock, for outage loops."""

from __future__ import annotations

import random

from bus import Clock


class Backoff:
    """Waits 50 ms, 100 ms, … up to ``cap_s``, each scaled by a random factor in [0.5, 1]."""

    def __init__(self, clock: Clock, *, cap_s: float, rng: random.Random | None = None) -> None:
        self._clock = clock
        self._cap_s = cap_s
        self._rng = rng or random.Random()
        self._next_s = 0.05

    def reset(self) -> None:
        """Start again from the shortest wait (after a success)."""
        self._next_s = 0.05

    async def wait(self) -> None:
        """Sleep the next interval."""
        await self._clock.sleep(min(self._next_s, self._cap_s) * self._rng.uniform(0.5, 1.0))
        self._next_s = min(self._next_s * 2, self._cap_s)
