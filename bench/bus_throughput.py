"""Throughput of publish -> consume -> ack: the bus against a hand-written redis-py floor.

    python bench/bus_throughput.py [--messages 20000] [--repeat 3] [--json-only]

Starts its own ``redis-server`` (free port, temporary directory, no persistence) so that
INFO commandstats counts only this benchmark, then runs four cases, each ``--repeat``
times, and prints one JSON object per case (the median run by rate):

- ``bus-1proc``   one process: Publisher.publish_many (idempotent publish script, batches
                  of 100) and a Worker with a no-op idempotent handler (dedupe claim,
                  fenced complete script, pipelined completions);
- ``bus-2proc``   the same publisher here, two Worker processes consuming;
- ``floor-1proc`` the same loop by hand with redis-py asyncio: pipelined XADD (100 per
                  round trip), XREADGROUP COUNT 100, payload decoded, pipelined XACK;
- ``floor-2proc`` that floor with two consumer processes.

The publisher keeps at most ``--window`` messages unacknowledged (it reads the group's
progress with XINFO GROUPS once per batch), so latencies are those of a loaded system,
not of an unbounded queue. Fields: ``rate_per_s`` (messages / time from the first publish
to the last ack), ``p50_ms``/``p99_ms`` (publish -> ack, from the entry id's Redis time to
the ack reply), ``cpu_us_per_unit`` (client CPU, publisher and consumers, per message),
``redis_cpu_us_per_msg``, ``redis_cmds_per_msg`` (INFO commandstats delta, script-internal
commands included). Benchmarks never become tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import bus  # noqa: E402
from bus import Bus, BusConfig, Publisher, Stream, Worker  # noqa: E402

STREAM = Stream("bench", "cmd")
GROUP = "bench"
BATCH = 100
COMMANDSTATS = "--commandstats" in sys.argv


class Work(msgspec.Struct, tag=True):
    """The benchmark's message."""

    n: int
    note: str = "a short payload of the size a command usually has"


# --- a private redis-server -------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="redsaga-bench-")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


# --- measurement helpers ----------------------------------------------------------------


def entry_ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


def now_ms() -> float:
    return time.time() * 1000


async def server_figures(client: aioredis.Redis) -> tuple[int, float]:
    """(commands run so far, Redis CPU seconds so far)."""
    stats = await client.info("commandstats")
    calls = sum(int(v["calls"]) for v in stats.values())
    cpu = await client.info("cpu")
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def print_commandstats(client: aioredis.Redis, impl: str) -> None:
    """With --commandstats: the run's ten costliest Redis commands (calls, us per call)."""
    if not COMMANDSTATS:
        return
    stats = await client.info("commandstats")
    top = sorted(stats.items(), key=lambda kv: -float(kv[1]["usec"]))[:10]
    summary = {k.removeprefix("cmdstat_"): [int(v["calls"]), float(v["usec_per_call"])] for k, v in top}
    print(json.dumps({"name": f"{impl}-commandstats", "calls_and_usec_per_call": summary}), flush=True)


async def acked(client: aioredis.Redis) -> int:
    for info in await client.xinfo_groups(STREAM.key):
        if info["name"] in (GROUP, GROUP.encode()):
            return int(info["entries-read"] or 0) - int(info["pending"])
    return 0


# --- publishers -------------------------------------------------------------------------


async def publish_bus(client: bus.Redis, total: int, window: int) -> None:
    publisher = Publisher(client, source="bench")
    for start in range(0, total, BATCH):
        while start - await acked(client) > window:
            await anyio.sleep(0.002)
        envelopes = [
            (STREAM, bus.new_envelope(Work(n=n), max_bytes=1 << 20, idempotency_key=f"w{n}"))
            for n in range(start, min(total, start + BATCH))
        ]
        await publisher.publish_many(envelopes)


async def publish_floor(client: aioredis.Redis, total: int, window: int) -> None:
    encoder = msgspec.json.Encoder()
    for start in range(0, total, BATCH):
        while start - await acked(client) > window:
            await anyio.sleep(0.002)
        async with client.pipeline(transaction=False) as pipe:
            for n in range(start, min(total, start + BATCH)):
                pipe.xadd(STREAM.key, {"id": str(n), "type": "Work", "data": encoder.encode(Work(n=n))})
            await pipe.execute()


# --- consumers --------------------------------------------------------------------------


class Recorder:
    """Ack times (wall ms) and publish -> ack latencies of one consumer."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.last_ack_ms = 0.0

    def ack(self, entry_ids: list[Any]) -> None:
        t = now_ms()
        self.last_ack_ms = t
        self.latencies.extend(t - entry_ms(i) for i in entry_ids)


def bus_worker(client: bus.Redis, recorder: Recorder, consumer: str) -> Worker:
    app = Bus("bench")

    @app.handler(STREAM, Work, group=GROUP)
    async def handle(_work: Work) -> None:
        return None

    # the bench's own throwaway redis-server runs without AOF on purpose: no warning about it
    config = BusConfig(concurrency=512, block_ms=100, on_no_aof="ignore")
    # the transport alone: signing is off, as in the floor it is compared with
    worker = Worker(client, app, config=config, consumer=consumer, auth=bus.SIGNING_OFF)
    for group_consumer in worker.consumers:
        settled = group_consumer._settled  # the bench times each ack reply (private on purpose)

        def timed(entry_id: str, outcome: Any, what: str, settled: Any = settled) -> None:
            recorder.ack([entry_id])
            settled(entry_id, outcome, what)

        group_consumer._settled = timed  # type: ignore[method-assign]
    return worker


async def floor_consumer(
    client: aioredis.Redis, recorder: Recorder, consumer: str, stop: anyio.Event
) -> None:
    decoder = msgspec.json.Decoder(Work)
    while not stop.is_set():
        reply = await client.xreadgroup(GROUP, consumer, {STREAM.key: ">"}, count=BATCH, block=100)
        if not reply:
            continue
        entries = reply[0][1]
        for _, fields in entries:
            decoder.decode(fields[b"data"])
        async with client.pipeline(transaction=False) as pipe:
            for entry_id, _ in entries:
                pipe.xack(STREAM.key, GROUP, entry_id)
            await pipe.execute()
        recorder.ack([entry_id for entry_id, _ in entries])


async def consumer_process(args: argparse.Namespace) -> None:
    """Entry point of a consumer process: consume until SIGTERM, then write figures.

    CPU is counted from readiness on, so interpreter start-up and imports are left out.
    """
    recorder = Recorder()
    cpu_ready = 0.0
    if args.impl == "bus":
        client = bus.connect(args.url)
        worker = bus_worker(client, recorder, args.consumer)
        async with anyio.create_task_group() as tg:

            async def ready() -> None:
                await worker.started.wait()
                nonlocal cpu_ready
                cpu_ready = time.process_time()
                await client.set(f"bench:ready:{args.consumer}", 1)

            tg.start_soon(ready)
            await worker.serve()
    else:
        client = aioredis.Redis.from_url(args.url, protocol=2)
        stop = anyio.Event()
        cpu_ready = time.process_time()
        await client.set(f"bench:ready:{args.consumer}", 1)
        async with anyio.create_task_group() as tg:

            async def on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                    async for _ in signals:
                        stop.set()
                        return

            tg.start_soon(on_signal)
            await floor_consumer(client, recorder, args.consumer, stop)
            tg.cancel_scope.cancel()
    await client.aclose()
    Path(args.out).write_text(
        json.dumps(
            {
                "latencies": recorder.latencies,
                "last_ack_ms": recorder.last_ack_ms,
                "cpu_s": time.process_time() - cpu_ready,
            }
        )
    )


# --- one run ----------------------------------------------------------------------------


async def reset(client: aioredis.Redis) -> None:
    await client.flushall()
    await client.xgroup_create(STREAM.key, GROUP, id="0", mkstream=True)
    await client.config_resetstat()


async def run_case(impl: str, processes: int, url: str, total: int, window: int) -> dict[str, Any]:
    client = bus.connect(url) if impl == "bus" else aioredis.Redis.from_url(url, protocol=2)
    await reset(client)
    recorders: list[Recorder] = []
    children: list[tuple[subprocess.Popen[bytes], Path]] = []
    cpu_start = time.process_time()
    if processes:
        tmp = Path(tempfile.mkdtemp(prefix="redsaga-bench-out-"))
        for i in range(processes):
            out = tmp / f"c{i}.json"
            command = [sys.executable, __file__, "--role", "consumer", "--impl", impl, "--url", url]
            command += ["--consumer", f"c{i}", "--out", str(out)]
            children.append((subprocess.Popen(command), out))
        while await client.exists(*[f"bench:ready:c{i}" for i in range(processes)]) < processes:
            await anyio.sleep(0.01)  # (a blocked XREADGROUP registers no consumer on Redis 7.0)
    calls0, redis_cpu0 = await server_figures(client)
    start_ms = now_ms()
    async with anyio.create_task_group() as tg:
        stop = anyio.Event()
        worker = None
        if not processes:
            recorder = Recorder()
            recorders.append(recorder)
            if impl == "bus":
                worker = bus_worker(client, recorder, "c0")
                tg.start_soon(worker.run)
                await worker.started.wait()
            else:
                tg.start_soon(floor_consumer, client, recorder, "c0", stop)
        if impl == "bus":
            await publish_bus(client, total, window)
        else:
            await publish_floor(client, total, window)
        while await acked(client) < total:
            await anyio.sleep(0.005)
        if worker is not None:
            worker.stop()
        stop.set()
    calls1, redis_cpu1 = await server_figures(client)
    await print_commandstats(client, impl)
    cpu_s = time.process_time() - cpu_start
    latencies: list[float] = []
    last_ack_ms = max((r.last_ack_ms for r in recorders), default=0.0)
    for r in recorders:
        latencies += r.latencies
    for proc, out in children:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        figures = json.loads(out.read_text())
        latencies += figures["latencies"]
        last_ack_ms = max(last_ack_ms, figures["last_ack_ms"])
        cpu_s += figures["cpu_s"]
    await client.aclose()
    latencies.sort()
    elapsed_s = (last_ack_ms - start_ms) / 1000
    return {
        "messages": total,
        "rate_per_s": round(total / elapsed_s),
        "p50_ms": round(latencies[len(latencies) // 2], 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)], 1),
        "cpu_us_per_unit": round(cpu_s * 1e6 / total, 1),
        "redis_cpu_us_per_msg": round((redis_cpu1 - redis_cpu0) * 1e6 / total, 1),
        "redis_cmds_per_msg": round((calls1 - calls0) / total, 2),
        "acks_seen": len(latencies),
    }


async def main(args: argparse.Namespace) -> None:
    server = RedisServer()
    try:
        results: dict[str, dict[str, Any]] = {}
        cases = [("floor", 0), ("bus", 0), ("floor", 2), ("bus", 2)]
        for impl, processes in cases:
            name = f"{impl}-{processes or 1}proc"
            if args.cases and name not in args.cases:
                continue
            runs = [
                await run_case(impl, processes, server.url, args.messages, args.window)
                for _ in range(args.repeat)
            ]
            runs.sort(key=lambda r: r["rate_per_s"])
            median = runs[len(runs) // 2]
            line = {"name": name, **median, "runs_rate_per_s": [r["rate_per_s"] for r in runs]}
            results[name] = line
            print(json.dumps(line), flush=True)
        for shape in ("1proc", "2proc"):
            if f"bus-{shape}" not in results or f"floor-{shape}" not in results:
                continue
            ratio = results[f"bus-{shape}"]["rate_per_s"] / results[f"floor-{shape}"]["rate_per_s"]
            print(json.dumps({"name": f"ratio-bus-vs-floor-{shape}", "ratio": round(ratio, 3)}), flush=True)
    finally:
        server.stop()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=int, default=2_000)
    parser.add_argument("--cases", nargs="*", default=[], help="run only these (e.g. bus-1proc)")
    parser.add_argument("--commandstats", action="store_true", help="print the top Redis commands")
    parser.add_argument("--role", choices=["main", "consumer"], default="main")
    parser.add_argument("--impl", choices=["bus", "floor"], default="bus")
    parser.add_argument("--url", default="")
    parser.add_argument("--consumer", default="c0")
    parser.add_argument("--out", default="")
    return parser.parse_args()


if __name__ == "__main__":
    import structlog

    structlog.configure(  # warnings and up, on stderr: stdout carries only the JSON result lines
        wrapper_class=structlog.make_filtering_bound_logger(30),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    arguments = parse()
    anyio.run(consumer_process if arguments.role == "consumer" else main, arguments)
