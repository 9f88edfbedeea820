"""The saga metrics of one worker: its transitions' counts, and its contexts' figures in Redis.

What the orchestrators counted comes from :class:`~saga.metrics._transitions.SagaTallies`;
sagas in flight (per definition, version and status: the partitions' counters), stuck
sagas (not moved for ``stuck_for_ms`` and not waiting within a wait's deadline, as
``saga stats`` counts them), timers due and the participants' dedupe records are read from
Redis at scrape time, a few commands per partition (``bus/_metrics.py`` says why and how).

The dedupe records are read here, by the orchestrator, not by the participants' workers: a
participant's records are written under its own Redis user, which its stolen credentials
hold too (docs/security.md), so the figure an alert trusts comes from another principal.
Participants are those workers registered (``Versions.participants``: a name counts only
with the record its own user wrote), so the labels are as bounded as the ACL users.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bus import Clock
from bus.lowlevel import redis_errors
from bus.metrics import REDIS, Figures, MetricSpec, ScrapeCollector
from saga.metrics._transitions import SagaTallies
from saga.ops.listing import count_idle
from saga.ops.stats import saga_counts
from saga.store.keys import Partition

_SAGA = ("context", "definition", "version")
_STEP = ("context", "definition", "step", "kind", "outcome")

SAGAS_STARTED = MetricSpec("redsaga_sagas_started_total", "counter", "Sagas this worker started.", _SAGA)
SAGAS_ENDED = MetricSpec(
    "redsaga_sagas_ended_total",
    "counter",
    "Sagas this worker ended, by end status: completed, failed, compensated, cancelled.",
    (*_SAGA, "status"),
)
SAGAS_DEAD_LETTERED = MetricSpec(
    "redsaga_sagas_dead_lettered_total",
    "counter",
    "Sagas this worker parked for an operator (a step or a compensation ran out of retries).",
    _SAGA,
)
SAGA_DURATION = MetricSpec(
    "redsaga_saga_duration_seconds",
    "histogram",
    "Sagas from start to end (end-to-end latency), by end status; dead_lettered: to being parked.",
    (*_SAGA, "status"),
)
STEP_DURATION = MetricSpec(
    "redsaga_step_duration_seconds",
    "histogram",
    "Step attempts from dispatch to outcome; kind is do, undo (compensation) or confirm; outcome "
    "ok, transient, permanent, timeout, cancelled or forced.",
    _STEP,
)
STEP_ATTEMPTS = MetricSpec(
    "redsaga_step_attempts_total", "counter", "Step attempts that ended, by kind and outcome.", _STEP
)
COMPENSATIONS = MetricSpec(
    "redsaga_compensations_total",
    "counter",
    "Compensations that finished: outcome compensated (undone) or failed (the saga was dead-lettered).",
    ("context", "definition", "step", "outcome"),
)
TIMER_LAG = MetricSpec(
    "redsaga_timer_lag_seconds",
    "histogram",
    "How late durable timers fired (retries, timeouts, sleeps, deadlines), by the timer clock.",
)
SAGAS_IN_FLIGHT = MetricSpec(
    "redsaga_sagas_in_flight",
    "gauge",
    "Sagas not ended: running, suspended, compensating or dead_lettered (the partitions' counters).",
    (*_SAGA, "status"),
    source=REDIS,
)
SAGAS_STUCK = MetricSpec(
    "redsaga_sagas_stuck",
    "gauge",
    "Sagas in flight that have not moved for the stuck threshold (10 minutes unless configured), "
    "waiting ones left out, as saga stats counts them.",
    ("context",),
    source=REDIS,
)
TIMERS_DUE = MetricSpec(
    "redsaga_timers_due", "gauge", "Durable timers due now and not yet fired.", ("context",), source=REDIS
)
DEDUPE_RECORDS = MetricSpec(
    "redsaga_dedupe_records",
    "gauge",
    "A participant's dedupe records in one partition (in-flight markers and first results, live "
    "or expired and not yet pruned); the engine keeps at most BusConfig.dedupe_quota, so more "
    "were written past it, with the participant's Redis user.",
    ("context", "participant", "partition"),
    source=REDIS,
)
SAGA_METRICS = (
    SAGAS_STARTED,
    SAGAS_ENDED,
    SAGAS_DEAD_LETTERED,
    SAGA_DURATION,
    STEP_DURATION,
    STEP_ATTEMPTS,
    COMPENSATIONS,
    TIMER_LAG,
    SAGAS_IN_FLIGHT,
    SAGAS_STUCK,
    TIMERS_DUE,
    DEDUPE_RECORDS,
)
"""Every metric an orchestrating worker exports beside the bus's."""


class SagaMetrics(ScrapeCollector):
    """The saga metrics of the contexts ``partitions`` belong to (see the module docstring).

    ``participants``: the participants registered for a context (``Versions.participants``),
    whose dedupe records are read.
    """

    specs = SAGA_METRICS

    def __init__(
        self,
        redis: Any,
        partitions: Sequence[Partition],
        clock: Clock,
        *,
        stuck_for_ms: int,
        participants: Callable[[str], Awaitable[list[str]]],
        timeout_s: float = 5.0,
    ) -> None:
        super().__init__(timeout_s=timeout_s)
        self.redis = redis
        self.participants = participants
        self.clock = clock
        self.stuck_for_ms = stuck_for_ms
        self.tallies = SagaTallies()
        self._contexts: dict[str, list[Partition]] = {}
        for partition in partitions:
            self._contexts.setdefault(partition.context, []).append(partition)

    def count(self, figures: Figures) -> None:
        """Copy what the transitions counted."""
        tallies = self.tallies
        for spec, counts in (
            (SAGAS_STARTED, tallies.started),
            (SAGAS_ENDED, tallies.ended),
            (SAGAS_DEAD_LETTERED, tallies.dead_lettered),
            (STEP_ATTEMPTS, tallies.attempts),
            (COMPENSATIONS, tallies.compensations),
        ):
            for labels, count in counts.items():
                figures.set(spec, labels, count)
        for labels, buckets in tallies.durations.items():
            figures.set(STEP_DURATION, labels, buckets.copy())
        for saga_labels, buckets in tallies.saga_durations.items():
            figures.set(SAGA_DURATION, saga_labels, buckets.copy())
        figures.set(TIMER_LAG, (), tallies.timer_lag.copy())

    async def read(self, figures: Figures) -> None:
        """Sagas in flight, stuck sagas and due timers, per context."""
        now_ms = self.clock.now_ms()
        timer_now = self.clock.script_now_ms()
        if timer_now < 0:  # the timer clock is Redis's
            with redis_errors():
                seconds, micros = await self.redis.time()
            timer_now = int(seconds) * 1000 + int(micros) // 1000
        for context, partitions in self._contexts.items():
            for row in await saga_counts(self.redis, partitions):
                if not row.status.terminal:
                    labels = (context, row.definition, str(row.version), row.status.value)
                    figures.set(SAGAS_IN_FLIGHT, labels, row.count)
            stuck, _ = await count_idle(self.redis, partitions, now_ms=now_ms, idle_ms=self.stuck_for_ms)
            figures.set(SAGAS_STUCK, (context,), stuck)
            with redis_errors():
                due = [int(await self.redis.zcount(p.timers, "-inf", timer_now)) for p in partitions]
            figures.set(TIMERS_DUE, (context,), sum(due))
            for participant in await self.participants(context):
                with redis_errors():
                    for p in partitions:
                        held = await self.redis.hlen(p.commands(participant).dedupe_key(participant))
                        figures.set(DEDUPE_RECORDS, (context, participant, str(p.index)), int(held))
