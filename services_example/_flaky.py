"""The demo's transient-failure injection: fail the first N attempts of each command."""

from __future__ import annotations

from collections import Counter

from bus import TransientError


class Flakiness:
    """Counts attempts per idempotency key and fails the first ``times`` of them."""

    def __init__(self) -> None:
        self._seen: Counter[str] = Counter()

    def check(self, key: str, times: int, what: str) -> None:
        """Raise :class:`~bus.TransientError` for the first ``times`` attempts of ``key``."""
        self._seen[key] += 1
        if self._seen[key] <= times:
            raise TransientError(f"{what} temporarily unavailable (attempt {self._seen[key]})")
