"""The timer scheduler: moves due timers into their partition's inbox.

Timers live in a sorted set per partition (score: due time by the Redis clock, or the
injected fake clock in tests). One script per batch reads the due ones, adds them to the
inbox and removes them, so any number of schedulers can run without firing a timer twice;
the saga ignores a firing that is no longer current. A crash between batches loses nothing:
unfired timers stay in the set.
"""

from __future__ import annotations

from typing import Any

from bus import Backoff, BusError, Clock
from bus._log import get_logger
from saga._config import EngineConfig
from saga._keys import Partition
from saga._store import FIRE_TIMERS

_log = get_logger("redsaga.saga")


async def fire_due(redis: Any, partition: Partition, clock: Clock, batch: int) -> int:
    """Fire every timer of ``partition`` that is due now; return how many fired."""
    total = 0
    while True:
        fired = int(
            await FIRE_TIMERS(
                redis,
                [partition.timers, partition.timer_data, partition.inbox.key],
                [clock.script_now_ms(), batch],
            )
        )
        total += fired
        if fired < batch:
            return total


async def run_scheduler(redis: Any, partitions: list[Partition], clock: Clock, config: EngineConfig) -> None:
    """Fire due timers of ``partitions`` every ``timer_poll_ms`` until cancelled."""
    backoff = Backoff(clock)
    while True:
        try:
            for partition in partitions:
                await fire_due(redis, partition, clock, config.timer_batch)
            backoff.reset()
        except BusError as error:
            _log.warning("timer scheduler failed; backing off", error=str(error))
            await backoff.wait()
            continue
        await clock.sleep(config.timer_poll_ms / 1000)
