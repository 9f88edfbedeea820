"""Durable timers: memory per pending timer, firing lag and scheduler CPU, next to a floor.

    python bench/timers.py [--redis-url redis://127.0.0.1:6379/14] [--pending 100000]
                           [--partitions 16] [--rate 1000] [--seconds 10]

Prints one JSON object per line. Each scenario runs redsaga's scheduler and then a
hand-written floor (names containing ``floor``), each in a child process so that its CPU is
its own:

- ``timers_memory`` / ``floor_timers_memory``: Redis memory per pending timer with
  ``--pending`` timers spread over ``--partitions`` partitions. redsaga keeps a sorted-set
  member (the timer id, scored by due time) and the timer's event and saga id in a hash;
  the floor keeps only the sorted-set member.
- ``timers_lag`` / ``floor_timers_lag``: with all those timers pending far in the future,
  ``--rate`` timers per second come due for ``--seconds``; one scheduler moves them into the
  partitions' inboxes while a reader blocks on the inboxes like an orchestrator.
  ``p50_ms``/``p99_ms`` is the firing lag: time the reader saw the entry minus the timer's
  due time (both on this host's clock, which Redis ``TIME`` also reads).
  ``cpu_us_per_unit`` is the scheduler's CPU per fired timer (Redis' CPU is not included;
  the scheduler's polling in the second before and after the window is). Run with the
  default ``timer_min_wait_ms`` (10 ms) and with 50 ms (rounds as sparse as the floor's).
- ``timers_burst`` / ``floor_timers_burst``: ``--pending`` timers all due at once: how fast
  one scheduler drains them (timers/s, batches of 500 per partition) and its CPU per timer.

The floor is the least a scheduler can do: per poll, one pipelined round of a minimal Lua
script per partition (``ZRANGEBYSCORE``, ``XADD`` of the id, ``ZREM``; batch 500), then a
fixed 50 ms sleep. redsaga's script also reads each timer's event from the hash and writes
a full inbox envelope, and its scheduler sleeps until the next due timer (at most
``timer_poll_ms`` = 50 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bus
from saga import EngineConfig
from saga.runtime.timer_firing import fire_round, run_scheduler
from saga.store.commit import TimerTemplate
from saga.store.keys import Partition

CONTEXT = "bench"
FLOOR_FIRE = """
local now = redis.call('TIME')
now = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 500)
for _, id in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'id', id)
  redis.call('ZREM', KEYS[1], id)
end
return #due
"""


def partitions(count: int) -> list[Partition]:
    return [Partition(CONTEXT, i) for i in range(count)]


def floor_keys(index: int) -> tuple[str, str]:
    return f"floor:{{{CONTEXT}:{index}}}:timers", f"floor:{{{CONTEXT}:{index}}}:inbox"


def timer_id(due_ms: int, n: int) -> str:
    """Shaped like the engine's: ``<saga id>:<step>:<kind>:<attempt>:<purpose>``, due time inside."""
    return f"{bus.derived_id('bench', str(n))}~{due_ms}:charge_payment:do:1:retry"


async def write_timers(redis: bus.Redis, floor: bool, parts: int, dues: list[int]) -> None:
    """Write timers as the transition script does (or as the floor would)."""
    for start in range(0, len(dues), 2_000):
        async with redis.pipeline(transaction=False) as pipe:
            for n in range(start, min(start + 2_000, len(dues))):
                ident = timer_id(dues[n], n)
                index = n % parts
                if floor:
                    pipe.zadd(floor_keys(index)[0], {ident: dues[n]})
                    continue
                partition = Partition(CONTEXT, index)
                template = TimerTemplate(purpose="retry", step="charge_payment", kind="do", attempt=1)
                pipe.zadd(partition.timers, {ident: dues[n]})
                pipe.hset(partition.timer_data, ident, template.stored(ident[:36]))
            await pipe.execute()


async def used_memory(redis: bus.Redis) -> int:
    info = await redis.info("memory")
    return int(info["used_memory"])


async def redis_ms(redis: bus.Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


# -- the child: one scheduler ------------------------------------------------------------


async def scheduler_child(url: str, floor: bool, parts: int, seconds: float, min_wait_ms: int) -> None:
    """Run one scheduler for ``seconds`` (0: until nothing is pending) and print its CPU."""
    redis = bus.connect(url)
    config = EngineConfig(timer_min_wait_ms=min_wait_ms)
    await redis.ping()
    started = time.process_time()
    if seconds == 0:
        await (floor_drain(redis, parts) if floor else drain(redis, parts, config))
    else:
        with anyio.move_on_after(seconds):
            if floor:
                await floor_scheduler(redis, parts)
            else:
                await run_scheduler(redis, partitions(parts), bus.SystemClock(), config)
    print(json.dumps({"cpu_s": time.process_time() - started}), flush=True)
    await redis.aclose()


async def floor_scheduler(redis: bus.Redis, parts: int) -> None:
    script = redis.register_script(FLOOR_FIRE)
    while True:
        async with redis.pipeline(transaction=False) as pipe:
            for index in range(parts):
                await script(keys=list(floor_keys(index)), client=pipe)
            await pipe.execute()
        await anyio.sleep(0.05)


async def drain(redis: bus.Redis, parts: int, config: EngineConfig) -> None:
    while (await fire_round(redis, partitions(parts), bus.SystemClock(), config.timer_batch)).fired:
        pass


async def floor_drain(redis: bus.Redis, parts: int) -> None:
    script = redis.register_script(FLOOR_FIRE)
    while True:
        async with redis.pipeline(transaction=False) as pipe:
            for index in range(parts):
                await script(keys=list(floor_keys(index)), client=pipe)
            if not sum(await pipe.execute()):
                return


def spawn(url: str, floor: bool, parts: int, seconds: float, min_wait_ms: int = 10) -> subprocess.Popen[str]:
    args = [sys.executable, __file__, "--role", "floor" if floor else "scheduler", "--redis-url", url]
    args += ["--partitions", str(parts), "--seconds", str(seconds), "--min-wait-ms", str(min_wait_ms)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


def child_cpu(process: subprocess.Popen[str]) -> float:
    out, _ = process.communicate(timeout=300)
    return float(json.loads(out.strip().splitlines()[-1])["cpu_s"])


# -- the reader: sees fired timers like an orchestrator -----------------------------------


async def read_inboxes(redis: bus.Redis, floor: bool, parts: int, expected: int, lags: list[float]) -> None:
    keys = [floor_keys(i)[1] if floor else Partition(CONTEXT, i).inbox.key for i in range(parts)]
    cursors = dict.fromkeys(keys, "0-0")
    while len(lags) < expected:
        reply = await redis.xread(cursors, count=1_000, block=1_000)
        seen = time.time() * 1000
        for key, entries in reply or ():
            for entry_id, fields in entries:
                cursors[key.decode()] = entry_id.decode()
                ident = fields[b"id"].decode() if floor else envelope_id(fields)
                due = int(ident.split("~", 1)[1].split(":", 1)[0])
                lags.append(seen - due)


def envelope_id(fields: dict[bytes, bytes]) -> str:
    """The id of a fired timer's entry (the timer id)."""
    return bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32).id


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


# -- scenarios ----------------------------------------------------------------------------


async def memory(url: str, floor: bool, parts: int, pending: int) -> dict[str, object]:
    redis = bus.connect(url)
    await redis.flushdb()
    before = await used_memory(redis)
    far = await redis_ms(redis) + 86_400_000
    await write_timers(redis, floor, parts, [far + n for n in range(pending)])
    after = await used_memory(redis)
    await redis.aclose()
    return {
        "name": f"{'floor_' if floor else ''}timers_memory",
        "timers": pending,
        "partitions": parts,
        "bytes_per_timer": round((after - before) / pending, 1),
        "rate_per_s": None,
        "p50_ms": None,
        "p99_ms": None,
        "cpu_us_per_unit": None,
    }


async def lag(
    url: str, floor: bool, *, parts: int, pending: int, rate: int, seconds: float, min_wait_ms: int = 10
) -> dict[str, object]:
    redis = bus.connect(url)
    await redis.flushdb()
    now = await redis_ms(redis)
    due_count = int(rate * seconds)
    far = now + 86_400_000
    await write_timers(redis, floor, parts, [far + n for n in range(pending - due_count)])
    dues = [int(n * 1000 / rate) for n in range(due_count)]
    begin = await redis_ms(redis) + 2_000 + len(dues) // 50  # time to write them and start the child
    dues = [begin + d for d in dues]
    await write_timers(redis, floor, parts, dues)
    now = await redis_ms(redis)
    child = spawn(url, floor, parts, seconds=(begin - now) / 1000 + seconds + 0.5, min_wait_ms=min_wait_ms)
    lags: list[float] = []
    with anyio.fail_after(seconds + 60):
        await read_inboxes(redis, floor, parts, due_count, lags)
    cpu = child_cpu(child)
    await redis.aclose()
    suffix = "" if floor or min_wait_ms == 10 else f"_min_wait_{min_wait_ms}ms"
    return {
        "name": f"{'floor_' if floor else ''}timers_lag{suffix}",
        "pending": pending,
        "partitions": parts,
        "rate_per_s": round(due_count / ((max(dues) - min(dues)) / 1000), 1),
        "p50_ms": percentile(lags, 0.50),
        "p99_ms": percentile(lags, 0.99),
        "max_ms": round(max(lags), 2),
        "mean_ms": round(statistics.fmean(lags), 2),
        "cpu_us_per_unit": round(cpu * 1e6 / due_count, 1),
    }


async def burst(url: str, floor: bool, parts: int, count: int) -> dict[str, object]:
    redis = bus.connect(url)
    await redis.flushdb()
    now = await redis_ms(redis)
    await write_timers(redis, floor, parts, [now - 1_000 + (n % 1_000) for n in range(count)])
    started = time.perf_counter()
    child = spawn(url, floor, parts, seconds=0)
    lags: list[float] = []
    with anyio.fail_after(600):
        await read_inboxes(redis, floor, parts, count, lags)
    elapsed = time.perf_counter() - started
    cpu = child_cpu(child)
    await redis.aclose()
    return {
        "name": f"{'floor_' if floor else ''}timers_burst",
        "timers": count,
        "partitions": parts,
        "rate_per_s": round(count / elapsed),
        "p50_ms": None,
        "p99_ms": None,
        "cpu_us_per_unit": round(cpu * 1e6 / count, 1),
        "note": "rate includes the child's start-up (~0.3 s); CPU does not",
    }


async def main(args: argparse.Namespace) -> None:
    for floor in (False, True):
        print(json.dumps(await memory(args.redis_url, floor, args.partitions, args.pending)), flush=True)
    for floor, min_wait in ((False, 10), (False, 50), (True, 0)):
        result = await lag(
            args.redis_url,
            floor,
            parts=args.partitions,
            pending=args.pending,
            rate=args.rate,
            seconds=args.seconds,
            min_wait_ms=min_wait,
        )
        print(json.dumps(result), flush=True)
    for floor in (False, True):
        print(json.dumps(await burst(args.redis_url, floor, args.partitions, args.pending)), flush=True)
    redis = bus.connect(args.redis_url)
    await redis.flushdb()
    await redis.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDSAGA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    )
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--role", choices=["bench", "scheduler", "floor"], default="bench")
    parser.add_argument("--min-wait-ms", type=int, default=10, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.role == "bench":
        anyio.run(main, options)
    else:
        anyio.run(
            scheduler_child,
            options.redis_url,
            options.role == "floor",
            options.partitions,
            options.seconds,
            options.min_wait_ms,
        )
