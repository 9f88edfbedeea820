"""The demo saga's shape as a Celery chain: the peer measured beside redsaga and the floor.

    python bench/saga_throughput.py --peers celery [--shapes inflight100,serial]

Three tasks that do nothing (reserve stock, charge, ship), chained
(``chain(reserve.s(n), charge.s(), ship.s())``), on a Redis broker, run by one Celery worker
with the prefork pool and two processes (``--concurrency 2``, this machine's cores). The
last task pushes the chain's number to a Redis list; the benchmark's driver pops it, so a
chain's latency is start to that push, with no result backend in the way (a backend would
add its own writes and polling to Celery's side). Celery keeps no state per chain besides
its messages: there is no history, no step record, no compensation and no dedupe, so this
compares the cost of moving a chain through Redis, not the guarantees.

``run_celery`` is what ``bench/saga_throughput.py --peers celery`` calls (lines named
``saga.<shape>.1proc.celery``). ``cpu_us_per_unit`` is the driver's CPU plus the worker's
and its pool processes' (read from ``/proc``); the worker's start-up is not counted.
Needs the ``peers`` extra (``pip install -e '.[peers]'``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
from celery import Celery, chain

import bus

BROKER_ENV = "REDSAGA_BENCH_CELERY_BROKER"
DONE = "celery-bench:done"
QUEUE = "celery-bench"

app = Celery("celery_chain", broker=os.environ.get(BROKER_ENV, "redis://127.0.0.1:6379/15"))
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="bench.reserve")
def reserve(n: int) -> int:
    return n


@app.task(name="bench.charge")
def charge(n: int) -> int:
    return n


@app.task(name="bench.ship")
def ship(n: int) -> int:
    with app.pool.acquire(block=True) as connection:
        connection.default_channel.client.rpush(DONE, n)
    return n


def start_chain(n: int) -> None:
    """Send chain ``n`` (the broker write is Celery's own, synchronous)."""
    chain(reserve.s(n), charge.s(), ship.s()).apply_async()


def spawn_worker(url: str) -> subprocess.Popen[bytes]:
    """One Celery worker, prefork pool, two processes, on broker ``url``."""
    command = [
        sys.executable, "-m", "celery", "-A", "celery_chain", "worker", "--pool", "prefork",
        "--concurrency", "2", "--queues", QUEUE, "--loglevel", "warning",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    env = {**os.environ, BROKER_ENV: url, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds used by process ``pid`` and every live descendant (``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    tree = {pid}
    grown = True
    while grown:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        grown = bool(more)
        tree |= more
    return sum(used.get(p, 0.0) for p in tree)


async def run_celery(url: str, shape: str, count: int, bench: ModuleType) -> dict[str, object]:
    """Run ``count`` chains in ``shape``; the result line, measured by ``bench``'s own tools.

    ``bench`` is the running ``bench/saga_throughput.py`` (its ``Tracker``, ``measure`` and
    ``finish``), passed in rather than imported: it runs as ``__main__``.
    """
    redis = bus.connect(url)
    await redis.flushdb()
    app.conf.broker_url = url
    worker = spawn_worker(url)
    tracker = bench.Tracker()
    try:
        warm = tracker.begin("-1")
        async with anyio.create_task_group() as tg:
            tg.start_soon(_collect, redis, tracker)
            await anyio.to_thread.run_sync(start_chain, -1)  # the worker is up once this one ends
            await warm.wait()
            tracker.latencies.clear()
            worker_cpu = tree_cpu_s(worker.pid)

            async def start(n: int) -> anyio.Event:
                event = tracker.begin(str(n))
                start_chain(n)
                return event

            result = await bench.measure(redis, shape, count, start, tracker)
            result["cpu_s"] = float(result["cpu_s"]) + tree_cpu_s(worker.pid) - worker_cpu  # type: ignore[arg-type]
            tg.cancel_scope.cancel()
    finally:
        worker.terminate()
        worker.wait(30)
    line = bench.finish(result, None, redis_memory=0, count=count)
    # Celery's own connections are not counted, and its memory per chain is not measured
    return line | {"cmds_per_saga": None, "bytes_per_saga": None}


async def _collect(redis: bus.Redis, tracker: Any) -> None:
    """Mark each chain done as its last task's push arrives."""
    while True:
        popped = await redis.blpop([DONE], timeout=1)
        if popped is not None:
            tracker.done(popped[1].decode())
