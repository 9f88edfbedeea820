"""The cost of a batch of script calls over many partitions: one Redis vs a Redis Cluster.

A worker's busiest path is a batch of ``FCALL``s for several partitions (completions,
publishes, transitions). On one server it is one lean write (``bus/_connection.py``); on a
cluster ``bus/_cluster.py`` routes each call to the master of its key's slot and sends them
through redis-py's cluster pipeline. Cases, each ``--batches`` batches of ``--size`` calls
of ``bus/lua/ack.lua`` on keys of ``--size`` partitions (``{bench:<i>}``), ``--window`` batches
in flight:

- ``single-lean``       one server, the lean batch (what a single-server worker runs)
- ``single-redis-py``   one server, redis-py's own pipeline (what the lean batch replaced)
- ``cluster-batch``     the cluster, the same batch entry point (``bus/_cluster_batch.py``: a
                        lean write per master, redis-py's pipeline for what it cannot place)
- ``cluster-redis-py``  the cluster, redis-py's cluster pipeline left to find each call's
                        slot (it asks a node with ``COMMAND GETKEYS`` per ``FCALL``)
- ``cluster-floor``     the cluster by hand: calls grouped by master, each group one lean
                        write to that master, the groups sent side by side

Each line is JSON: ``name``, ``rate_per_s`` (calls), ``p50_ms`` and ``p99_ms`` (per
batch), ``cpu_us_per_unit`` (client CPU per call). Without ``--redis-url`` and
``--cluster-url`` it starts a private server and a 6-node cluster (``tests/cluster.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bus
from bus._connection import send_batch
from bus.lowlevel import Script, load_libraries, owner_of, primaries, slot_of

ACK = Script.load("bus", "ack")
Batch = Callable[[], Awaitable[Any]]


def calls(size: int) -> list[tuple[Any, ...]]:
    """``size`` FCALLs of ack.lua, one per partition key (an ack of nothing: cheap, repeatable)."""
    return [ACK.call([f"rs:{{bench:{i}}}:inbox"], ["g", "0-1"]).command for i in range(size)]


async def measure(name: str, batch: Batch, batches: int, window: int, size: int) -> dict[str, Any]:
    """Run ``batch`` ``batches`` times, ``window`` at once; one JSON-ready line."""
    latencies: list[float] = []
    limit = asyncio.Semaphore(window)

    async def one() -> None:
        async with limit:
            started = time.perf_counter()
            await batch()
            latencies.append(time.perf_counter() - started)

    for _ in range(max(1, batches // 20)):  # warm up connections and libraries
        await batch()
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(batches)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    latencies.sort()
    return {
        "name": name,
        "rate_per_s": round(batches * size / wall),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
        "cpu_us_per_unit": round(cpu / (batches * size) * 1e6, 2),
    }


def floor_batch(cluster: Any, by_node: dict[str, Any], commands: Sequence[tuple[Any, ...]]) -> Batch:
    """The hand-written cluster path: group by master, one lean write per master, side by side."""
    groups: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for command in commands:
        groups[owner_of(cluster, slot_of(str(command[3])))].append(command)

    async def run() -> None:
        await asyncio.gather(*(send_batch(by_node[node], group) for node, group in groups.items()))

    return run


async def redis_py_pipeline(client: Any, commands: Sequence[tuple[Any, ...]]) -> None:
    """redis-py's pipeline, left to route each command itself."""
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    await pipe.execute(raise_on_error=False)


async def main(args: argparse.Namespace) -> None:
    commands = calls(args.size)
    async with AsyncExitStack() as stack:
        single_url, cluster_url = args.redis_url, args.cluster_url
        if not single_url:
            from tests.conftest import _start_private_redis, pytest_unconfigure  # noqa: PLC0415 - no server given

            single_url = _start_private_redis()
            stack.callback(pytest_unconfigure, None)
        if not cluster_url:
            from tests.cluster import LocalCluster  # noqa: PLC0415 - no cluster given

            own = LocalCluster().start()
            stack.callback(own.stop)
            cluster_url = own.url
        single = bus.connect(single_url)
        cluster = bus.connect(cluster_url)
        plain = bus.Redis.from_url(single_url)
        for client in (single, cluster, plain):
            stack.push_async_callback(client.aclose)
        await load_libraries(single, [ACK.library])
        await load_libraries(cluster, [ACK.library])
        by_node = {node.name: bus.connect(f"redis://{node.name}/0") for node in await primaries(cluster)}
        for client in by_node.values():
            stack.push_async_callback(client.aclose)
        cases: list[tuple[str, Batch]] = [
            ("single-lean", lambda: send_batch(single, commands)),
            ("single-redis-py", lambda: redis_py_pipeline(plain, commands)),
            ("cluster-batch", lambda: send_batch(cluster, commands)),
            ("cluster-redis-py", lambda: redis_py_pipeline(cluster, commands)),
            ("cluster-floor", floor_batch(cluster, by_node, commands)),
        ]
        for name, batch in cases:
            if args.only and name not in args.only:
                continue
            print(json.dumps(await measure(name, batch, args.batches, args.window, args.size)), flush=True)


if __name__ == "__main__":
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--redis-url", default="", help="a single Redis (default: start one)")
    parser.add_argument("--cluster-url", default="", help="redis+cluster://… (default: start 6 nodes)")
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--size", type=int, default=12, help="calls per batch, one partition each")
    parser.add_argument("--window", type=int, default=8, help="batches in flight")
    parser.add_argument("--only", nargs="*", default=[], help="run only these cases")
    asyncio.run(main(parser.parse_args()))
