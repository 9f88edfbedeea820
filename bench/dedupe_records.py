"""What an idempotent handler's dedupe record costs in Redis: its claim, its completion, its memory.

    python bench/dedupe_records.py [--entries 5000] [--batch 100] [--rounds 3] [--redis-url URL]

Against a private ``redis-server`` it starts (or ``--redis-url``, whose database it never
flushes: it writes keys under ``rs:{bench-dedupe:0}:*`` and deletes them): adds ``--entries``
entries to a stream, reads them as one consumer, claims them (``lua/dedupe_claim.lua``, one
call per ``--batch`` entries, as a worker claims what one read returned) and completes them
(``lua/complete_batch.lua``, merged per batch, each recording its result), ``--rounds``
times. Prints one JSON object per round: Redis's own time per entry for the claims and for
the completions (``INFO commandstats``, ``cmdstat_fcall``), so the machine's noise outside
Redis stays out, and the memory the records take (``used_memory`` before and after, the
stream's own growth excluded).
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
from bus import BusConfig, Delivery, Stream  # noqa: E402
from bus._outcomes import complete_part, dedupe_claim_call, encode_result  # noqa: E402
from bus._scripts import load_libraries, merge  # noqa: E402
from redsaga.cli._functions import libraries  # noqa: E402

GROUP = "bench"
STREAM = Stream("bench-dedupe:0", "cmd:bench")
CONFIG = BusConfig()
RESULT = encode_result(None, CONFIG) + b"Charged\x00" + b'{"receipt":"r-0000000000"}'


async def _clear(redis: bus.Redis) -> None:
    for key in await redis.keys("rs:{bench-dedupe:0}:*"):
        await redis.delete(key)


async def _fcall(redis: bus.Redis) -> float:
    return float((await redis.info("commandstats"))["cmdstat_fcall"]["usec"])


async def _round(redis: bus.Redis, entries: int, batch: int) -> dict[str, object]:
    await _clear(redis)
    await redis.xgroup_create(STREAM.key, GROUP, id="0", mkstream=True)
    pipe = redis.pipeline(transaction=False)
    for i in range(entries):
        pipe.xadd(STREAM.key, {"e": f"entry {i}".encode()})
    await pipe.execute()
    read = await redis.xreadgroup(GROUP, "c", {STREAM.key: ">"}, count=entries)
    deliveries = [
        Delivery(
            envelope=bus.Envelope(id=f"m-{n}", type="Charge", payload=b"{}"),
            stream=STREAM,
            group=GROUP,
            entry_id=entry_id.decode(),
            deliveries=1,
            consumer="c",
            dedupe_key=f"saga-{n:06d}:charge:do",
        )
        for n, (entry_id, _) in enumerate(read[0][1])
    ]
    batches = [deliveries[i : i + batch] for i in range(0, entries, batch)]
    before = int((await redis.info("memory"))["used_memory"])
    await redis.config_resetstat()
    for part in batches:
        await dedupe_claim_call(part, CONFIG).run(redis)
    claimed = await _fcall(redis)
    for part in batches:
        await merge([complete_part(d, RESULT, None, CONFIG) for d in part]).run(redis)
    completed = await _fcall(redis) - claimed
    await redis.delete(STREAM.key)  # what is left is the records
    stored = int((await redis.info("memory"))["used_memory"]) - before
    await _clear(redis)
    return {
        "case": "dedupe_records",
        "entries": entries,
        "claim_usec_per_entry": round(claimed / entries, 2),
        "complete_usec_per_entry": round(completed / entries, 2),
        "bytes_per_record": round(stored / entries, 1),
    }


async def main(url: str, entries: int, batch: int, rounds: int) -> None:
    redis = bus.connect(url)
    try:
        await load_libraries(redis, libraries())
        for _ in range(rounds):
            print(json.dumps(await _round(redis, entries, batch)))
    finally:
        await redis.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=5000)
    parser.add_argument("--batch", type=int, default=100, help="entries per claim and per completion call")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    if args.redis_url:
        asyncio.run(main(args.redis_url, args.entries, args.batch, args.rounds))
    else:
        with private_redis("bench-dedupe-") as url:
            asyncio.run(main(url, args.entries, args.batch, args.rounds))
