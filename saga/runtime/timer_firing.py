"""The timer scheduler: moves due timers into their partition's inbox.

Timers live in a sorted set per partition (score: due time in Unix ms). Which clock judges
"due" is decided in one place, the ``fire_timers.lua`` script: Redis ``TIME`` in
production (``SystemClock.script_now_ms()`` is ``-1``), the test's :class:`~bus.FakeClock`
in tests. A worker's own clock never decides, so a worker whose clock jumps forwards or
backwards fires nothing early and nothing late.

One script per partition and batch reads the due timers, adds them to the inbox and
removes them, so any number of schedulers can run without firing a timer twice, and a
scheduler killed mid-round loses nothing (unfired timers stay in the set; a batch is all or
nothing). The saga ignores a firing that is no longer current. Every round fires all
partitions in one pipelined round trip and then waits until the soonest next timer (as the
script measured it on the timer clock), at least ``timer_min_wait_ms`` (so a steady stream
of timers is fired in batches) and at most ``timer_poll_ms`` (to see timers started since).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bus import BusError, Clock
from bus.lowlevel import Backoff, get_logger, run_batch
from saga.runtime.config import EngineConfig
from saga.store.keys import Partition
from saga.store.scripts import FIRE_TIMERS
from saga.store.trust import orchestrator_of

_log = get_logger("redsaga.saga")


@dataclass(frozen=True, slots=True)
class Round:
    """What one round of firing did."""

    fired: int
    wait_ms: int | None
    """Time until the soonest pending timer, by the timer clock (``None``: none pending)."""
    lags_ms: tuple[int, ...] = ()
    """How late each fired timer fired, by the timer clock (the timer-lag metric)."""


async def fire_round(redis: Any, partitions: Sequence[Partition], clock: Clock, batch: int) -> Round:
    """Fire every timer of ``partitions`` that is due now, in pipelined batches."""
    fired, soonest, lags = 0, None, []
    pending = list(partitions)
    while pending:
        now = clock.script_now_ms()
        calls = [
            FIRE_TIMERS.call(
                [p.timers, p.timer_data, p.inbox.key],
                [now, batch, orchestrator_of(p.context)],
            )
            for p in pending
        ]
        full = []
        for partition, result in zip(pending, await run_batch(redis, calls), strict=True):
            if isinstance(result, BusError):
                raise result
            count, script_now, next_due, *late = (int(x) for x in result)
            fired += count
            lags.extend(late)
            if count >= batch:
                full.append(partition)
            elif next_due >= 0:
                wait = max(0, next_due - script_now)
                soonest = wait if soonest is None else min(soonest, wait)
        pending = full
    return Round(fired, soonest, tuple(lags))


async def fire_due(redis: Any, partition: Partition, clock: Clock, batch: int) -> int:
    """Fire every timer of ``partition`` that is due now; return how many fired."""
    return (await fire_round(redis, [partition], clock, batch)).fired


async def run_scheduler(
    redis: Any,
    partitions: list[Partition],
    clock: Clock,
    config: EngineConfig,
    observe: Callable[[Round], None] | None = None,
) -> None:
    """Fire due timers of ``partitions`` until cancelled, waking for the soonest next timer.

    ``observe`` is called with every round that fired something (metrics).
    """
    backoff = Backoff(clock)
    while True:
        try:
            result = await fire_round(redis, partitions, clock, config.timer_batch)
            backoff.reset()
            if observe is not None and result.fired:
                observe(result)
        except BusError as error:
            _log.warning("timer scheduler failed; backing off", error=str(error))
            await backoff.wait()
            continue
        wait_ms = (
            config.timer_poll_ms if result.wait_ms is None else min(result.wait_ms, config.timer_poll_ms)
        )
        await clock.sleep(max(wait_ms, config.timer_min_wait_ms, 1) / 1000)
