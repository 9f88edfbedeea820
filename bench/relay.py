"""Relay benchmark: PostgreSQL outbox -> Redis stream.

Prints one JSON object per line:

- ``relay_1_throughput`` / ``relay_2_throughput``: a pre-filled outbox drained by one relay
  (in this process) and by two relays (``saga relay --drain`` child processes). The rate is
  rows / (last XADD - first XADD), from the stream entry ids (Redis server clock), so process
  start-up does not count.
- ``floor_1_throughput``: a hand-written minimal loop over the same table (SELECT … FOR
  UPDATE SKIP LOCKED, pipelined XADD, UPDATE … = ANY, COMMIT): no dedupe script, no checks,
  no per-key order. What the relay costs is the ratio to this line.
- ``relay_latency_notify`` / ``relay_latency_poll``: a producer commits one row per transaction
  at ``--rate`` rows/s for ``--seconds``; latency is XADD time (entry id) minus the time just
  before COMMIT was sent. One relay child process woken by LISTEN/NOTIFY, then one polling
  every ``--poll-interval`` seconds with NOTIFY off.

``cpu_us_per_unit`` is the relay process's user+system CPU per row (children: from wait4,
less the CPU of starting a relay on an empty outbox); the database's and Redis's CPU is not
counted. p50/p99 are commit-to-XADD latencies (latency lines only; ``null`` elsewhere).

    .venv/bin/python bench/relay.py --dsn postgresql://postgres@127.0.0.1:5432/test_relay \\
        --redis-url redis://127.0.0.1:6379/11
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# This file is bench/relay.py: drop its folder from the path so "import relay" finds the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import anyio  # noqa: E402
import msgspec  # noqa: E402
import psycopg  # noqa: E402

import bus  # noqa: E402
import relay  # noqa: E402
from relay._codec import decode_envelope  # noqa: E402

SAGA = str(Path(sys.executable).parent / "saga")
TABLES = relay.Tables.prefixed("bench")
STREAM = bus.Stream.named("bench")


class Event(msgspec.Struct, tag=True):
    order: str
    amount: int


def emit(name: str, rate: float, p50: float | None, p99: float | None, cpu_us: float, **extra: Any) -> None:
    line = {
        "name": name,
        "rate_per_s": round(rate, 1),
        "p50_ms": None if p50 is None else round(p50, 2),
        "p99_ms": None if p99 is None else round(p99, 2),
        "cpu_us_per_unit": round(cpu_us, 1),
        **extra,
    }
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def reset(dsn: str, redis: bus.Redis) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for table in (TABLES.outbox, TABLES.inbox, TABLES.archive, TABLES.versions):
            await conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
        await conn.execute(f"DROP FUNCTION IF EXISTS {TABLES.outbox}_notify() CASCADE")
    await relay.init_db(dsn, TABLES)
    await redis.delete(STREAM.key, STREAM.published_key)


async def prefill(dsn: str, rows: int, keys: int) -> None:
    outbox = relay.Outbox(TABLES)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for i in range(rows):
            await outbox.add(conn, STREAM, Event(order=f"o{i}", amount=i), ordering_key=f"saga-{i % keys}")
            if i % 1000 == 999:
                await conn.commit()
        await conn.commit()


async def xadd_span_s(redis: bus.Redis) -> tuple[int, float]:
    """Entries on the bench stream and the seconds between the first and the last XADD."""
    first = await redis.xrange(STREAM.key, count=1)
    last = await redis.xrevrange(STREAM.key, count=1)
    count = int(await redis.xlen(STREAM.key))
    if not first:
        return 0, 0.0
    span_ms = int(last[0][0].split(b"-")[0]) - int(first[0][0].split(b"-")[0])
    return count, max(span_ms, 1) / 1000


def spawn_relay(dsn: str, redis_url: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [SAGA, "relay", "--dsn", dsn, "--redis-url", redis_url, "--tables", "bench", "--json", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def reap(process: subprocess.Popen[bytes]) -> float:
    """Wait for ``process``; return its CPU seconds (user + system)."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode not in (0, -15):
        raise RuntimeError(f"relay exited with {process.returncode}")
    return usage.ru_utime + usage.ru_stime


async def startup_cpu_s(dsn: str, redis_url: str, redis: bus.Redis) -> float:
    await reset(dsn, redis)
    return reap(spawn_relay(dsn, redis_url, "--drain"))


async def relay_in_process(dsn: str, redis: bus.Redis, rows: int, keys: int, batch: int) -> None:
    await reset(dsn, redis)
    await prefill(dsn, rows, keys)
    worker = relay.Relay.connect(dsn, redis, config=relay.RelayConfig(tables=TABLES, batch_size=batch))
    cpu = time.process_time()
    await worker.run(drain=True)
    cpu = time.process_time() - cpu
    count, span = await xadd_span_s(redis)
    assert count == rows, f"expected {rows} entries, found {count}"
    emit(
        "relay_1_throughput_in_process",
        count / span,
        None,
        None,
        cpu / rows * 1e6,
        rows=rows,
        keys=keys,
        batch=batch,
    )


async def relay_children(
    dsn: str,
    redis_url: str,
    redis: bus.Redis,
    *,
    rows: int,
    keys: int,
    batch: int,
    baseline: float,
    relays: int,
) -> None:
    await reset(dsn, redis)
    await prefill(dsn, rows, keys)
    children = [spawn_relay(dsn, redis_url, "--drain", "--batch-size", str(batch)) for _ in range(relays)]
    cpu = sum(reap(child) for child in children) - baseline * relays
    count, span = await xadd_span_s(redis)
    assert count == rows, f"expected {rows} entries, found {count}"
    emit(
        f"relay_{relays}_throughput",
        count / span,
        None,
        None,
        cpu / rows * 1e6,
        rows=rows,
        keys=keys,
        batch=batch,
    )


async def floor(dsn: str, redis: bus.Redis, rows: int, keys: int, batch: int) -> None:
    """The hand-written floor: the least a relay must do to move these rows."""
    await reset(dsn, redis)
    await prefill(dsn, rows, keys)
    select = (
        f"SELECT id, stream, envelope FROM {TABLES.outbox} WHERE status = 0 "
        f"ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    update = f"UPDATE {TABLES.outbox} SET status = 1 WHERE id = ANY(%s)"
    cpu = time.process_time()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        while True:
            cursor = await conn.execute(select, (batch,))
            found = await cursor.fetchall()
            if not found:
                await conn.rollback()
                break
            async with redis.pipeline(transaction=False) as pipe:
                for _, stream, blob in found:
                    pipe.xadd(stream, decode_envelope(bytes(blob)).to_fields())
                await pipe.execute()
            await conn.execute(update, ([row[0] for row in found],))
            await conn.commit()
    cpu = time.process_time() - cpu
    count, span = await xadd_span_s(redis)
    assert count == rows
    emit("floor_1_throughput", count / span, None, None, cpu / rows * 1e6, rows=rows, keys=keys, batch=batch)


async def latency(
    dsn: str,
    redis_url: str,
    redis: bus.Redis,
    *,
    rate: float,
    seconds: float,
    notify: bool,
    poll_s: float,
    baseline: float,
) -> None:
    await reset(dsn, redis)
    args = ["--poll-interval", str(poll_s)] + ([] if notify else ["--no-listen"])
    child = spawn_relay(dsn, redis_url, *args)
    outbox = relay.Outbox(TABLES)
    sent_at: dict[str, float] = {}
    total = int(rate * seconds)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await anyio.sleep(1.0)  # let the child start and LISTEN
        start = time.monotonic()
        for i in range(total):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            envelope = outbox.envelope(Event(order=f"o{i}", amount=i))
            await outbox.add_envelope(conn, STREAM, envelope, ordering_key=f"saga-{i % 100}")
            sent_at[envelope.id] = time.time() * 1000
            await conn.commit()
        achieved = total / (time.monotonic() - start)
    with anyio.fail_after(30):
        while int(await redis.xlen(STREAM.key)) < total:
            await anyio.sleep(0.05)
    child.terminate()
    cpu = reap(child) - baseline
    latencies = []
    for entry_id, fields in await redis.xrange(STREAM.key):
        xadd_ms = int(entry_id.split(b"-")[0])
        latencies.append(xadd_ms - sent_at[bus.decode_fields(fields, max_bytes=1 << 22, max_fields=32).id])
    name = "relay_latency_notify" if notify else "relay_latency_poll"
    emit(
        name,
        achieved,
        percentile(latencies, 0.50),
        percentile(latencies, 0.99),
        cpu / total * 1e6,
        rows=total,
        poll_interval_s=poll_s,
        max_ms=round(max(latencies), 2),
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dsn",
        default=os.environ.get("REDSAGA_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test_relay"),
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1000, help="distinct ordering keys")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--poll-interval", type=float, default=0.1)
    options = parser.parse_args()
    redis = bus.connect(options.redis_url)
    try:
        baseline = await startup_cpu_s(options.dsn, options.redis_url, redis)
        await floor(options.dsn, redis, options.rows, options.keys, options.batch)
        await relay_in_process(options.dsn, redis, options.rows, options.keys, options.batch)
        for relays in (1, 2):
            await relay_children(
                options.dsn,
                options.redis_url,
                redis,
                rows=options.rows,
                keys=options.keys,
                batch=options.batch,
                baseline=baseline,
                relays=relays,
            )
        for notify in (True, False):
            await latency(
                options.dsn,
                options.redis_url,
                redis,
                rate=options.rate,
                seconds=options.seconds,
                notify=notify,
                poll_s=options.poll_interval,
                baseline=baseline,
            )
    finally:
        await reset(options.dsn, redis)
        await redis.aclose()


if __name__ == "__main__":
    anyio.run(main)
