"""The in-process runner's rate limits: the buckets of ``rate_take.lua``, on the virtual clock.

The same arithmetic as the Redis script (a test runs both on one sequence of calls), so a
test of a saga under a limit sees what production would: commands over the limit wait as
``rate`` timers, and :meth:`~saga.testing.SagaRunner.advance` brings their tokens due.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bus import FakeClock
from saga.core.decision import Decision
from saga.core.model import SagaState
from saga.core.rate_rules import gives_back, hold, takes
from saga.definition.rate import Limits, RateLimit

GRANTS_KEPT_MS = 60_000
"""How long a command's grant is remembered after its time (as the script keeps it)."""


@dataclass(slots=True)
class Bucket:
    """One limit's bucket: tokens (below zero: tokens promised), last refill, grants."""

    rate: float
    burst: int
    tokens: float
    at: int
    grants: dict[str, int] = field(default_factory=dict)

    def refill(self, now: int) -> None:
        """Add the tokens earned since the last refill (at most ``burst``)."""
        if now > self.at:
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate / 1000)
            self.at = now


class MemoryBuckets:
    """Every limit's bucket for one runner (see the module docstring)."""

    def __init__(self, limits: Limits, clock: FakeClock) -> None:
        self.limits = limits
        self.clock = clock
        self.buckets: dict[str, Bucket] = {}

    def bucket(self, limit: RateLimit) -> Bucket:
        """``limit``'s bucket, full at first."""
        found = self.buckets.get(limit.name)
        if found is None:
            now = self.clock.now_ms()
            found = self.buckets[limit.name] = Bucket(limit.per_second, limit.burst, limit.burst, now)
        return found

    def take(self, limit: RateLimit, command_id: str) -> int:
        """When ``command_id`` may go (ms): now, or when its promised token is due."""
        bucket, now = self.bucket(limit), self.clock.now_ms()
        if command_id in bucket.grants:
            return bucket.grants[command_id]
        bucket.refill(now)
        bucket.tokens -= 1
        when = now if bucket.tokens >= 0 else now + math.ceil(-bucket.tokens * 1000 / bucket.rate)
        bucket.grants[command_id] = when
        bucket.grants = {c: t for c, t in bucket.grants.items() if t >= now - GRANTS_KEPT_MS}
        return when

    def release(self, limit: RateLimit, command_id: str) -> bool:
        """Give back ``command_id``'s token; whether it held one."""
        bucket = self.bucket(limit)
        if bucket.grants.pop(command_id, None) is None:
            return False
        bucket.refill(self.clock.now_ms())
        bucket.tokens = min(bucket.burst, bucket.tokens + 1)
        return True

    def set(self, name: str, *, rate: float | None = None, burst: int | None = None) -> None:
        """Change limit ``name`` as ``saga limits set`` does: from now on."""
        bucket = self.bucket(self.limits.by_name[name])
        bucket.refill(self.clock.now_ms())
        bucket.rate = bucket.rate if rate is None else rate
        bucket.burst = bucket.burst if burst is None else burst
        bucket.tokens = min(bucket.burst, bucket.tokens)

    def gate(self, decision: Decision, before: SagaState | None) -> None:
        """Take ``decision``'s tokens, hold what must wait, give back what it gave up."""
        now = self.clock.now_ms()
        for dispatch, limit in takes(self.limits, decision.state, decision.effects):
            when = self.take(limit, dispatch.command_id)
            if when > now:
                decision.effects = hold(decision.state, decision.effects, dispatch, when, when - now)
        for attempt, limit in gives_back(self.limits, before, decision.state, decision.effects):
            self.release(limit, attempt.command_id)
