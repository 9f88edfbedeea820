"""A payments worker process that handles what is on its stream, then reports its memory.

Run as ``python -m tests.faults.bulk_worker REDIS_URL CONCURRENCY`` from the repository
root. It prints one JSON line: the orders it handled and its resident set before the work
and at its peak (``VmHWM``), in KiB, so a test can bound what oversized entries cost.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio

import bus
from bus import BusConfig, Worker
from tests.bus.test_contract import payments_app


def memory_kib(field: str) -> int:
    """One ``Vm…`` figure of this process, in KiB (Linux ``/proc``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(field)


async def main(url: str, concurrency: int) -> None:
    """Handle every entry available now, then print the report."""
    redis = bus.connect(url)
    effects: list[str] = []
    worker = Worker(redis, payments_app(effects), config=BusConfig(concurrency=concurrency))
    before = memory_kib("VmRSS")
    await worker.run_until_idle()
    await redis.aclose()
    print(json.dumps({"effects": effects, "before_kib": before, "peak_kib": memory_kib("VmHWM")}))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
