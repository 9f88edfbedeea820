"""A timer scheduler and nothing else, run as a process: ``python -m tests.saga.timer_proc``.

The fault test SIGKILLs it while it fires; environment: ``TIMER_REDIS_URL``, ``TIMER_BATCH``.
"""

from __future__ import annotations

import os

import anyio

import bus
from saga import EngineConfig
from saga.runtime.timer_firing import run_scheduler
from saga.store.keys import Partition
from tests.saga.nap_sagas import nap


async def main() -> None:
    """Fire due timers of every partition of the nap context until killed."""
    redis = bus.connect(os.environ["TIMER_REDIS_URL"])
    config = EngineConfig(timer_batch=int(os.environ.get("TIMER_BATCH", "25")), timer_poll_ms=20)
    partitions = [Partition(nap.context.name, i) for i in range(nap.context.partitions)]
    await run_scheduler(redis, partitions, bus.SystemClock(), config)


if __name__ == "__main__":
    anyio.run(main)
