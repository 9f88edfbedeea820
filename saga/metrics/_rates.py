"""The rate limits' metrics of one worker: what its gate did, and each bucket in Redis.

Labelled by limit (a participant or ``<saga>.<step>``), never by saga: the label sets are as
many as the limits an app declares. Counted figures are this worker's (sum them over
workers); the buckets are read from Redis at scrape time, one pipelined read per limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bus.lowlevel import redis_errors
from bus.metrics import REDIS, Figures, MetricSpec, ScrapeCollector
from saga.definition.rate import RateLimit
from saga.runtime.rate_gate import RateTallies
from saga.store.keys import LimitKeys

_LIMIT = ("limit",)

RATE_COMMANDS = MetricSpec(
    "redsaga_rate_limited_commands_total",
    "counter",
    "Commands a rate limit applies to, by outcome: sent (a token at once) or delayed (held as a "
    "durable timer until its token was due).",
    (*_LIMIT, "outcome"),
)
RATE_DELAY = MetricSpec(
    "redsaga_rate_limit_delay_seconds_total",
    "counter",
    "The time delayed commands were held for their tokens, summed (divide by the delayed count "
    "for the mean wait).",
    _LIMIT,
)
RATE_RETURNED = MetricSpec(
    "redsaga_rate_limit_tokens_returned_total",
    "counter",
    "Tokens given back by held commands that were never sent (cancelled, compensated or forced "
    "while they waited).",
    _LIMIT,
)
RATE_TOKENS = MetricSpec(
    "redsaga_rate_limit_tokens",
    "gauge",
    "Tokens in a limit's bucket now; below zero, how many commands wait for a promised token.",
    _LIMIT,
    source=REDIS,
)
RATE_PER_S = MetricSpec(
    "redsaga_rate_limit_rate",
    "gauge",
    "The rate a limit enforces, per second (the operator's, after saga limits set).",
    _LIMIT,
    source=REDIS,
)
RATE_METRICS = (RATE_COMMANDS, RATE_DELAY, RATE_RETURNED, RATE_TOKENS, RATE_PER_S)
"""Every metric of a worker whose app declares rate limits."""


class RateMetrics(ScrapeCollector):
    """The rate-limit figures of one worker's orchestrators (see the module docstring)."""

    specs = RATE_METRICS

    def __init__(
        self,
        redis: Any,
        tallies: Sequence[RateTallies],
        limits: Sequence[RateLimit],
        *,
        timeout_s: float = 5.0,
    ) -> None:
        super().__init__(timeout_s=timeout_s)
        self.redis = redis
        self.tallies = list(tallies)
        self.limits = list(limits)

    def count(self, figures: Figures) -> None:
        """Sum what the orchestrators' gates counted."""
        for limit in self.limits:
            name = limit.name
            figures.set(RATE_COMMANDS, (name, "sent"), sum(t.sent[name] for t in self.tallies))
            figures.set(RATE_COMMANDS, (name, "delayed"), sum(t.delayed[name] for t in self.tallies))
            figures.set(RATE_DELAY, (name,), sum(t.delay_ms[name] for t in self.tallies) / 1000)
            figures.set(RATE_RETURNED, (name,), sum(t.released[name] for t in self.tallies))

    async def read(self, figures: Figures) -> None:
        """Each bucket's tokens (refilled up to now, as a take would) and rate."""
        with redis_errors():
            seconds, micros = await self.redis.time()
            now = int(seconds) * 1000 + int(micros) // 1000
            for limit in self.limits:
                tokens, at, rate, burst = await self.redis.hmget(
                    LimitKeys(limit.name).bucket, "tokens", "at", "rate", "burst"
                )
                per_s = float(rate) if rate is not None else limit.per_second
                size = int(burst) if burst is not None else limit.burst
                level = float(size) if tokens is None else float(tokens)
                if at is not None and now > int(at):
                    level = min(size, level + (now - int(at)) * per_s / 1000)
                figures.set(RATE_TOKENS, (limit.name,), level)
                figures.set(RATE_PER_S, (limit.name,), per_s)
