"""What the dead-letter quota costs a dead letter, in Redis, next to a dead letter without it.

    python bench/letter_quota.py [--letters 5000] [--redis-url redis://127.0.0.1:6379/0]

Against a private ``redis-server`` it starts (or ``--redis-url``, whose database it never
flushes: it writes keys under ``rs:{bench-quota:0}:*`` and deletes them): adds ``--letters``
entries to a stream, reads them as one consumer, and dead-letters each with ``lua/fail.lua``,
once without a quota (participants' command streams), once with (a saga inbox: one HINCRBY,
and a PEXPIRE per window), and once past the quota (the entry is acknowledged and counted,
no letter written), each ``--rounds`` times, interleaved. Prints one JSON object per run:
Redis's own time per call (``INFO commandstats``, ``cmdstat_fcall``), so the machine's noise
outside Redis stays out, the letters kept and the dead-letter stream's memory
(``MEMORY USAGE``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

# bench/relay.py would shadow the relay package that the function libraries come from
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bus  # noqa: E402
from bench.private_redis import private_redis  # noqa: E402
from bus import BusConfig, Stream  # noqa: E402
from bus._outcomes import dead_letter_call  # noqa: E402
from bus._scripts import load_libraries  # noqa: E402
from redsaga.cli._functions import libraries  # noqa: E402

GROUP = "bench"


async def _case(
    redis: bus.Redis, name: str, letters: int, quota: str, config: BusConfig
) -> dict[str, object]:
    stream = Stream("bench-quota:0", f"s-{name}")
    for key in await redis.keys("rs:{bench-quota:0}:*"):
        await redis.delete(key)
    await redis.xgroup_create(stream.key, GROUP, id="0", mkstream=True)
    pipe = redis.pipeline(transaction=False)
    for i in range(letters):
        pipe.xadd(stream.key, {"e": f"entry {i}".encode()})
    await pipe.execute()
    read = await redis.xreadgroup(GROUP, "c", {stream.key: ">"}, count=letters)
    ids = [entry_id.decode() for entry_id, _ in read[0][1]]
    await redis.config_resetstat()
    for entry_id in ids:
        call = dead_letter_call(
            stream, GROUP, "c", entry_id, dead=True, error="bench", reason="bench", config=config, quota=quota
        )
        await call.run(redis)
    stats = await redis.info("commandstats")
    fcall = stats["cmdstat_fcall"]
    kept = await redis.xlen(stream.dlq_key)
    stored = await redis.memory_usage(stream.dlq_key, samples=0) or 0
    for key in await redis.keys("rs:{bench-quota:0}:*"):
        await redis.delete(key)
    return {
        "case": f"letter_quota.{name}",
        "calls": fcall["calls"],
        "usec_per_call": fcall["usec_per_call"],
        "kept": kept,
        "dlq_bytes": stored,
    }


async def main(url: str, letters: int, rounds: int) -> None:
    redis = bus.connect(url)
    try:
        await load_libraries(redis, libraries())
        roomy = BusConfig(letter_quota=2 * letters)
        cases = [
            ("none", "", roomy),
            ("under", "participant:payments", roomy),
            ("over", "participant:payments", BusConfig(letter_quota=1)),
        ]
        for name, quota, config in cases * rounds:
            print(json.dumps(await _case(redis, name, letters, quota, config)))
    finally:
        await redis.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--letters", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3, help="each case this many times, interleaved")
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    if args.redis_url:
        asyncio.run(main(args.redis_url, args.letters, args.rounds))
    else:
        with private_redis("bench-quota-") as url:
            asyncio.run(main(url, args.letters, args.rounds))
