"""Redis memory per completed saga, by key kind, next to the hand-written floor's.

    python bench/memory.py [--redis-url redis://127.0.0.1:6379/5] [--sagas 300] [--signing on]

Runs ``--sagas`` of the 3-step demo saga one at a time (retention off, so every saga and its
history stay), then sums ``MEMORY USAGE … SAMPLES 0`` over every key of the database by
kind: the part of the key after its hash tag, up to the next ``:`` (``saga``, ``hist``,
``inbox``, ``cmd``, ``dedupe``, …). Then the same for ``bench/saga_throughput.py``'s floor.
The benchmark flushes its Redis database: give it one of its own.

Prints one JSON line each (``memory.redsaga[.signed]``, ``memory.floor``): ``rate_per_s``,
``p50_ms``, ``p99_ms``, ``cpu_us_per_unit`` (client CPU per saga), ``sent_bytes_per_saga``
(bytes the server read from its clients), ``bytes_per_saga`` (every key's memory per
saga), ``kept_bytes_per_saga`` (without the streams, which trimming empties, and the
dedupe records, which expire) and ``bytes_by_kind`` (per saga, by kind).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import saga_throughput as throughput

import bus

TRANSIENT = frozenset({"inbox", "cmd", "dedupe", "dedupe-expiry", "dlq", "events"})
"""Kinds that do not stay with a completed saga: streams (trimmed) and dedupe records (expiring)."""

FIELDS = ("rate_per_s", "p50_ms", "p99_ms", "cpu_us_per_unit", "sent_bytes_per_saga")


def kind_of(key: bytes) -> str:
    """``rs:{orders:0}:hist:<id>`` -> ``hist``; ``floor:{p}:saga:<id>`` -> ``saga``."""
    _, _, rest = key.partition(b"}:")
    return (rest or key).split(b":", 1)[0].decode(errors="replace")


async def memory_by_kind(redis: bus.Redis) -> dict[str, int]:
    """Every key's ``MEMORY USAGE`` (exact: ``SAMPLES 0``), summed by :func:`kind_of`."""
    totals: collections.Counter[str] = collections.Counter()
    async for key in redis.scan_iter(count=1000):
        usage = await redis.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0")
        totals[kind_of(key)] += int(usage or 0)
    return dict(totals)


def per_saga(result: dict[str, object], totals: dict[str, int], count: int) -> dict[str, object]:
    """The run's line, with its memory by kind per saga."""
    kept = sum(size for kind, size in totals.items() if kind not in TRANSIENT)
    line = {key: result[key] for key in FIELDS}
    return {
        **line,
        "bytes_per_saga": round(sum(totals.values()) / count),
        "kept_bytes_per_saga": round(kept / count),
        "bytes_by_kind": {kind: round(size / count) for kind, size in sorted(totals.items())},
        "sagas": count,
    }


async def redsaga(url: str, count: int, signed: bool) -> dict[str, object]:
    result = await throughput.run_redsaga(url, "serial", count, 1, "m-", signed=signed)
    return per_saga(result, await memory_by_kind(bus.connect(url)), count)


async def floor(url: str, count: int) -> dict[str, object]:
    result = await throughput.run_floor(url, "serial", count, 1, "m-")
    return per_saga(result, await memory_by_kind(bus.connect(url)), count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDSAGA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
    )
    parser.add_argument("--sagas", type=int, default=300)
    parser.add_argument("--signing", default="on", help="off, on, or off,on")
    args = parser.parse_args()
    for signing in args.signing.split(","):
        line = anyio.run(redsaga, args.redis_url, args.sagas, signing == "on")
        name = "memory.redsaga" + (".signed" if signing == "on" else "")
        print(json.dumps({"name": name, **line}), flush=True)
    line = anyio.run(floor, args.redis_url, args.sagas)
    print(json.dumps({"name": "memory.floor", **line}), flush=True)


if __name__ == "__main__":
    main()
