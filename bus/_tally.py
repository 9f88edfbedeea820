"""Counts and durations kept on the hot path as plain Python values, for metrics.

The hot path only adds to ints and to a :class:`Buckets` (one ``bisect`` and three adds,
no lock): the worker's event loop is the only writer. What a scrape exports is a copy taken
on that loop (``bus/_metrics.py``), so a scrape served from another thread never sees a
half-updated histogram, and nothing here imports the Prometheus client.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

DURATION_BOUNDS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 1800.0, 3600.0,
)  # fmt: skip
"""Upper bounds, in seconds, of the duration histograms: from a Redis round trip (half a
millisecond) to a participant that answers within the hour."""


class Buckets:
    """A histogram: how many observations fell at or below each bound, their sum and count."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = DURATION_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        """Observations per bucket (not cumulative); the last one is above every bound."""
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Record one observation."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def copy(self) -> Buckets:
        """An independent copy (what a scrape exports)."""
        copied = Buckets(self.bounds)
        copied.counts = list(self.counts)
        copied.count, copied.total = self.count, self.total
        return copied

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs as Prometheus exposes them, ``+Inf`` last."""
        pairs, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            running += count
            pairs.append((bound, float(running)))
        return pairs
