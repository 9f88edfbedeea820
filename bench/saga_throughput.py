"""Sagas per second through the 3-step demo saga, next to a hand-written floor.

    python bench/saga_throughput.py [--redis-url redis://127.0.0.1:6379/5] [--sagas 2000]

Prints one JSON object per line. Shapes: ``burst`` (N started at once), ``inflight100``
(100 kept in flight), ``serial`` (one at a time); in one process, and split over two
(orchestrator + client here, participants in a child process). Each shape runs redsaga and
then the floor (lines named ``….floor``): the same 3-step saga written by hand on redis-py
asyncio with consumer groups, COUNT 100 batched reads, and one EVALSHA per step, pipelined
per batch. Compare ratios, not absolute numbers: the machine is shared and noisy.

``--metrics off,on`` runs redsaga a second time with the worker's Prometheus metrics
installed (``saga.metrics.WorkerMetrics``: transition hooks, delivery counts, round-trip
timing; lines named ``….metrics``), scraped once at the end, to price the hot path's part.

``--tracing off,on`` runs redsaga a second time with OpenTelemetry tracing on (lines named
``….traced``): the SDK's ``TracerProvider`` with a ``SimpleSpanProcessor`` and an exporter
that counts and drops the spans, so every span is recorded and handed over as it ends, as
with a real exporter minus its I/O; ``spans_per_saga`` says how many. One process only: the
child process does not trace.

``--replica-acks 0,1`` runs redsaga a second time with ``BusConfig.replica_acks=1`` (lines
named ``….acks1``): every start and publish waits in its pipeline for ``WAIT 1`` on each master
it wrote to, to price replica acknowledgement (needs a replica per master: a cluster's).

``--peers celery`` runs the same saga as a Celery chain after the floor, one process of
driver and a prefork worker of two (lines named ``….celery``; ``bench/celery_chain.py``).

``--signing off,on`` runs redsaga a second time with every entry signed and checked
(lines named ``….signed``; every principal's keyring issued from one master for the run,
the child process holding only the participants'), to price signing beside the same floor.

Fields: ``rate_per_s`` (sagas/s), ``p50_ms``/``p99_ms`` (start -> completed, seen by the
orchestrator), ``cpu_us_per_unit`` (client CPU per saga, all processes),
``redis_cpu_us_per_unit`` (the Redis server's CPU per saga, from ``INFO cpu``: every
client's, so run it on a server nothing else uses), ``redis_script_us_per_unit`` (the time
Redis spent inside scripts and functions per saga, ``FCALL``/``EVALSHA``/``EVAL`` with the
commands they call, from ``INFO commandstats``: steadier than the CPU, which also counts the
server's reading and replying), ``cmds_per_saga`` (top-level Redis
commands sent per saga, counted in the client), ``sent_bytes_per_saga`` (bytes the Redis
server read from its clients per saga, from ``INFO stats``' ``total_net_input_bytes``: every
client's), ``bytes_per_saga`` (Redis memory per completed saga, retention off).

The fan-out shape (``--shapes fanout``; lines ``saga.fanout.…``) runs one saga whose map
has ``--branches`` branches (1,000) at most ``--fanout-concurrency`` (50) in flight, with
one worker process (orchestrator and participant), and with two (both run both, racing for
the saga's replies), next to its floor (a hand-written fan-out: one script per reply that
counts it and sends the next command). Fields: ``branches_per_s``, ``conflicts_per_branch``
(transition commits that lost a revision race, counted in every process),
``cpu_us_per_branch``, ``cmds_per_branch``, ``saga_hash_bytes`` and ``branch_bytes`` (Redis
memory of the saga hash, and of the branch hash per branch, at the end).
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import bus
from bus._auth import KEYRING_ENV, encode_keyrings, load_keyrings
from bus._redispy import LeanConnection
from bus.tracing import use_tracer_provider
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import inventory, payments, shipping
from saga import (
    App,
    Command,
    CommandContext,
    EngineConfig,
    Key,
    Participant,
    RateLimit,
    Saga,
    SagaClient,
    SagaState,
    SagaStatus,
    SagaWorker,
    command,
)
from saga.metrics import WorkerMetrics
from saga.ops.keyrings import issue_keyrings, new_master, reach_of
from saga.runtime import orchestrator as orchestrator_module
from saga.runtime.gc_tuning import tune_gc
from saga.store.commit import commit_result
from saga.store.keys import Partition

# -- counting top-level commands in the client ---------------------------------------------

COMMANDS = [0]
_pack_command = LeanConnection.pack_command
_pack_batch = LeanConnection.pack_batch


def _count(self, *args):  # type: ignore[no-untyped-def]
    """Count every command redis-py sends on a lean connection."""
    COMMANDS[0] += 1
    return _pack_command(self, *args)


def _count_batch(self, commands):  # type: ignore[no-untyped-def]
    """Count every command of a lean batch (``bus._connection.send_batch``)."""
    COMMANDS[0] += len(commands)
    return _pack_batch(self, commands)


LeanConnection.pack_command = _count  # type: ignore[method-assign]
LeanConnection.pack_batch = _count_batch  # type: ignore[method-assign]

CONFIG = EngineConfig(retention_s=0, auth=bus.SIGNING_OFF)  # the defaults; retention off to count bytes
ORCHESTRATOR_APP = App("bench-orders", sagas=[order_fulfilment])
PARTICIPANTS_APP = App("bench-participants", participants=[inventory, payments, shipping])
ALL_APP = App("bench-all", sagas=[order_fulfilment], participants=[inventory, payments, shipping])
LIMITED_APP = App(
    "bench-limited",
    sagas=[order_fulfilment],
    participants=[inventory, payments, shipping],
    limits=[RateLimit("payments", 1_000_000.0, burst=1_000_000)],  # a token for every charge
)
KEYED = copy.copy(order_fulfilment)  # the same steps, and a concurrency key every order finds free
KEYED.concurrency = Key(lambda o: o.id).named(KEYED.name)
KEYED_APP = App("bench-keyed", sagas=[KEYED], participants=[inventory, payments, shipping])


def signing_keys(principals: list[str]) -> str:
    """A keyring file (JSON) holding ``principals``, issued from a master made for the run."""
    reach = reach_of(ALL_APP, clients=["bench"])
    return encode_keyrings(issue_keyrings(MASTER, reach, principals)).decode()


MASTER = new_master()
PARTICIPANT_PRINCIPALS = ["participant:inventory", "participant:payments", "participant:shipping"]


def config_for(keys: str | None, acks: int = 0) -> EngineConfig:
    """The bench's engine config, signing with the keyring ``keys`` (JSON) when given, its
    producers waiting for ``acks`` replicas (``BusConfig.replica_acks``)."""
    if keys is None and not acks:
        return CONFIG
    auth = bus.Authenticator(load_keyrings(keys)) if keys else bus.SIGNING_OFF
    return EngineConfig(retention_s=0, auth=auth, bus=bus.BusConfig(replica_acks=acks))


def order(n: int) -> Order:
    return Order(id=f"b{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=100)


# -- shapes ---------------------------------------------------------------------------------


class Tracker:
    """Start times and completion times per saga id; wakes waiters on completion."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.latencies: list[float] = []
        self.failures = 0
        self.waiters: dict[str, anyio.Event] = {}

    def begin(self, saga_id: str) -> anyio.Event:
        self.started[saga_id] = time.perf_counter()
        event = self.waiters[saga_id] = anyio.Event()
        return event

    def done(self, saga_id: str) -> None:
        began = self.started.pop(saga_id, None)
        if began is not None:
            self.latencies.append((time.perf_counter() - began) * 1000)
            self.waiters.pop(saga_id).set()


Start = Callable[[int], Awaitable[anyio.Event]]


async def drive(shape: str, count: int, start: Start) -> None:
    if shape == "serial":
        for n in range(count):
            await (await start(n)).wait()
        return
    if shape == "burst":  # every saga started at once, one task each
        async with anyio.create_task_group() as tg:
            for n in range(count):
                tg.start_soon(one_saga, start, n)
        return
    # 100 in flight: 100 tasks, each starting its next saga when its last one ended (not a
    # task per saga waiting for a slot: thousands of parked tasks would be the harness's own
    # garbage-collector load, on both sides)
    numbers = iter(range(count))

    async def keep_one_in_flight() -> None:
        for n in numbers:
            await one_saga(start, n)

    async with anyio.create_task_group() as tg:
        for _ in range(100):
            tg.start_soon(keep_one_in_flight)


async def one_saga(start: Start, n: int) -> None:
    await (await start(n)).wait()


# -- redsaga --------------------------------------------------------------------------------


class CountingExporter(SpanExporter):
    """Counts the spans handed to it and drops them (the SDK's work without an exporter's I/O)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def tracing_on() -> tuple[TracerProvider, CountingExporter]:
    exporter = CountingExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    return provider, exporter


async def run_redsaga(
    url: str,
    shape: str,
    count: int,
    procs: int,
    tag: str,
    *,
    signed: bool = False,
    metrics: bool = False,
    traced: bool = False,
    acks: int = 0,
    limited: bool = False,
    keyed: bool = False,
) -> dict[str, object]:
    tracing = tracing_on() if traced else None
    try:
        result = await _run_redsaga(
            url, shape, count, procs, tag, signed=signed, metrics=metrics, acks=acks, limited=limited,
            keyed=keyed,
        )  # fmt: skip
    finally:
        use_tracer_provider(None)
    if tracing is not None:
        result["spans_per_saga"] = round(tracing[1].spans / count, 2)
    return result


async def _run_redsaga(
    url: str,
    shape: str,
    count: int,
    procs: int,
    tag: str,
    *,
    signed: bool = False,
    metrics: bool = False,
    acks: int = 0,
    limited: bool = False,
    keyed: bool = False,
) -> dict[str, object]:
    redis = bus.connect(url)
    await redis.flushdb()
    tracker = Tracker()
    here = ["orchestrator:orders"] + (PARTICIPANT_PRINCIPALS if procs == 1 else [])
    config = config_for(signing_keys(here) if signed else None, acks)
    app = (LIMITED_APP if limited else KEYED_APP if keyed else ALL_APP) if procs == 1 else ORCHESTRATOR_APP
    definition = KEYED if keyed else order_fulfilment
    worker = SagaWorker(redis, app, config=config)

    def observe(state: SagaState) -> None:
        if state.status.terminal or state.status == SagaStatus.DEAD_LETTERED:
            if state.status != SagaStatus.COMPLETED:
                tracker.failures += 1
            tracker.done(state.id)

    worker.observe(observe)
    scrape = WorkerMetrics(worker) if metrics else None
    # writes sagas as the orchestrator; shares the worker's cache, as a client embedded in a
    # worker's process does (a client in another process costs one read per saga more)
    client = worker.client()

    async def start(n: int) -> anyio.Event:
        event = tracker.begin(f"{tag}{n}")
        await client.start(definition, order(n), saga_id=f"{tag}{n}")
        return event

    child = (
        spawn_child(url, "redsaga", signing_keys(PARTICIPANT_PRINCIPALS) if signed else None, acks)
        if procs == 2
        else None
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.started.wait()
        if child is not None:
            await wait_for_ready(child)
        result = await measure(redis, shape, count, start, tracker)
        if scrape is not None:  # once, outside the measured run: what a scrape reads is not hot-path cost
            result["metrics_bytes"] = len(await scrape.exposition())
        worker.stop()
    return finish(result, child, redis_memory=await used_memory(redis), count=count)


# -- the floor ------------------------------------------------------------------------------

FLOOR_START = """
redis.call('HSET', KEYS[1], 'step', 1, 'status', 'running')
return redis.call('XADD', KEYS[2], '*', 'saga', ARGV[1], 'step', 1)
"""
FLOOR_REPLY = """
redis.call('XADD', KEYS[2], '*', 'saga', ARGV[2], 'step', ARGV[3], 'ok', 1)
return redis.call('XACK', KEYS[1], 'p', ARGV[1])
"""
FLOOR_TRANSITION = """
local step = tonumber(redis.call('HGET', KEYS[1], 'step'))
if step ~= tonumber(ARGV[3]) then
  redis.call('XACK', KEYS[2], 'o', ARGV[1])
  return 0
end
if step == 3 then
  redis.call('HSET', KEYS[1], 'step', 4, 'status', 'completed')
else
  redis.call('HSET', KEYS[1], 'step', step + 1)
  redis.call('XADD', KEYS[3], '*', 'saga', ARGV[2], 'step', step + 1)
end
redis.call('XACK', KEYS[2], 'o', ARGV[1])
return step
"""
FLOOR_STEPS = ("inventory", "payments", "shipping")


def floor_key(*parts: str) -> str:
    return "floor:{p}:" + ":".join(parts)


async def floor_participant(redis: bus.Redis, name: str, next_stream: str) -> None:
    reply = await redis.script_load(FLOOR_REPLY)
    stream = floor_key("cmd", name)
    while True:
        batch = await redis.xreadgroup("p", "c", {stream: ">"}, count=100, block=1000)
        if not batch:
            continue
        # EVALSHA on the pipeline: a redis-py Script object would add a SCRIPT EXISTS round
        # trip to every pipeline (Pipeline.load_scripts), which a hand-written loop does not do;
        # as a raw command, which a cluster pipeline routes by its keys (its evalsha() refuses)
        async with redis.pipeline(transaction=False) as pipe:
            for entry_id, fields in batch[0][1]:
                pipe.execute_command(
                    "EVALSHA", reply, 2, stream, next_stream, entry_id, fields[b"saga"], fields[b"step"]
                )
            await pipe.execute()


async def floor_orchestrator(redis: bus.Redis, on_done: Callable[[str], None]) -> None:
    transition = await redis.script_load(FLOOR_TRANSITION)
    inbox = floor_key("inbox")
    while True:
        batch = await redis.xreadgroup("o", "c", {inbox: ">"}, count=100, block=1000)
        if not batch:
            continue
        entries = batch[0][1]
        async with redis.pipeline(transaction=False) as pipe:
            for entry_id, fields in entries:
                saga, step = fields[b"saga"].decode(), int(fields[b"step"])
                following = floor_key("cmd", FLOOR_STEPS[step]) if step < 3 else inbox
                keys = (floor_key("saga", saga), inbox, following)
                pipe.execute_command("EVALSHA", transition, 3, *keys, entry_id, saga, step)
            results = await pipe.execute()
        for (_, fields), step in zip(entries, results, strict=True):
            if step == 3:
                on_done(fields[b"saga"].decode())


async def floor_groups(redis: bus.Redis) -> None:
    await redis.xgroup_create(floor_key("inbox"), "o", id="0", mkstream=True)
    for name in FLOOR_STEPS:
        await redis.xgroup_create(floor_key("cmd", name), "p", id="0", mkstream=True)


async def floor_participants(redis: bus.Redis, tg: anyio.abc.TaskGroup) -> None:
    for name in FLOOR_STEPS:
        tg.start_soon(floor_participant, redis, name, floor_key("inbox"))


async def run_floor(url: str, shape: str, count: int, procs: int, tag: str) -> dict[str, object]:
    redis = bus.connect(url)
    await redis.flushdb()
    await floor_groups(redis)
    tracker = Tracker()
    start_script = redis.register_script(FLOOR_START)

    async def start(n: int) -> anyio.Event:
        saga = f"{tag}{n}"
        event = tracker.begin(saga)
        await start_script(keys=[floor_key("saga", saga), floor_key("cmd", "inventory")], args=[saga])
        return event

    child = spawn_child(url, "floor") if procs == 2 else None
    async with anyio.create_task_group() as tg:
        tg.start_soon(floor_orchestrator, redis, tracker.done)
        if child is None:
            await floor_participants(redis, tg)
        else:
            await wait_for_ready(child)
        result = await measure(redis, shape, count, start, tracker)
        tg.cancel_scope.cancel()
    return finish(result, child, redis_memory=await used_memory(redis), count=count)


# -- measuring ------------------------------------------------------------------------------


async def measure(
    redis: bus.Redis, shape: str, count: int, start: Start, tracker: Tracker
) -> dict[str, object]:
    memory_before = await used_memory(redis)
    server_before = await server_cpu_s(redis)
    scripts_before = await script_time_s(redis)
    sent_before = await bytes_received(redis)
    COMMANDS[0] = 0
    cpu, wall = time.process_time(), time.perf_counter()
    await drive(shape, count, start)
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    server = await server_cpu_s(redis) - server_before
    scripts = await script_time_s(redis) - scripts_before
    sent = await bytes_received(redis) - sent_before
    latencies = sorted(tracker.latencies)
    return {
        "rate_per_s": round(count / wall, 1),
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
        "cpu_s": cpu,
        "redis_cpu_us_per_unit": round(server / count * 1e6, 1),
        "redis_script_us_per_unit": round(scripts / count * 1e6, 1),
        "sent_bytes_per_saga": round(sent / count),
        "commands": COMMANDS[0],
        "memory_before": memory_before,
        "sagas": count,
        "failed": tracker.failures,
    }


def finish(
    result: dict[str, object], child: subprocess.Popen[str] | None, *, redis_memory: int, count: int
) -> dict[str, object]:
    cpu = float(result.pop("cpu_s"))  # type: ignore[arg-type]
    commands = int(result.pop("commands"))  # type: ignore[call-overload]
    if child is not None:
        child.terminate()
        out, _ = child.communicate(timeout=30)
        stats = json.loads(out.strip().splitlines()[-1])
        commands += stats["commands"]
        cpu += stats["cpu_s"]
    result["cpu_us_per_unit"] = round(cpu / count * 1e6, 1)
    result["cmds_per_saga"] = round(commands / count, 2)
    result["bytes_per_saga"] = round((redis_memory - int(result.pop("memory_before"))) / count)  # type: ignore[call-overload]
    return result


async def used_memory(redis: bus.Redis) -> int:
    return int((await redis.info("memory"))["used_memory"])


async def bytes_received(redis: bus.Redis) -> int:
    """Bytes the Redis server has read from its clients (every client's, as for the CPU)."""
    return int((await redis.info("stats"))["total_net_input_bytes"])


async def script_time_s(redis: bus.Redis) -> float:
    """Seconds Redis has spent running scripts and functions (every client's, as for the CPU)."""
    stats = await redis.info("commandstats")
    names = ("fcall", "evalsha", "eval")
    return sum(float(stats.get(f"cmdstat_{name}", {}).get("usec", 0)) for name in names) / 1e6


async def server_cpu_s(redis: bus.Redis) -> float:
    """CPU seconds the Redis server has used (every client's: keep the server to yourself)."""
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def spawn_child(url: str, kind: str, keys: str | None = None, acks: int = 0) -> subprocess.Popen[str]:
    env = {**os.environ, KEYRING_ENV: keys} if keys else None
    return subprocess.Popen(
        [sys.executable, __file__, "--child", kind, "--redis-url", url, "--replica-acks", str(acks)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


async def wait_for_ready(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    line = await anyio.to_thread.run_sync(child.stdout.readline)
    assert line.strip() == "ready", line


async def child_main(kind: str, url: str, acks: int = 0) -> None:
    """Participants in their own process; prints 'ready', then its counts on SIGTERM."""
    redis = bus.connect(url)
    COMMANDS[0] = 0
    cpu = time.process_time()
    count_conflicts()
    async with anyio.create_task_group() as tg:
        if kind == "redsaga":
            worker = SagaWorker(redis, PARTICIPANTS_APP, config=config_for(os.environ.get(KEYRING_ENV), acks))
            tg.start_soon(worker.run)
            await worker.started.wait()
        elif kind.startswith("fanout:"):  # a second worker racing for the fan-out saga's replies
            worker = SagaWorker(redis, fanout_app(int(kind.split(":")[1])), config=CONFIG)
            tg.start_soon(worker.run)
            await worker.started.wait()
        else:
            await floor_participants(redis, tg)
        if kind.startswith("fanout:"):  # count the run only, not the worker's start-up
            COMMANDS[0], CONFLICTS[0], cpu = 0, 0, time.process_time()
        print("ready", flush=True)
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                break
        tg.cancel_scope.cancel()
    stats = {"commands": COMMANDS[0], "cpu_s": time.process_time() - cpu, "conflicts": CONFLICTS[0]}
    print(json.dumps(stats), flush=True)


# -- fan-out: one saga, many branches ------------------------------------------------------------


class Fan(msgspec.Struct, frozen=True):
    branches: int


class Piece(msgspec.Struct, tag=True, frozen=True):
    n: int


class PieceDone(msgspec.Struct, tag=True, frozen=True):
    n: int


def fanout_saga(concurrency: int) -> Saga[Fan]:
    saga: Saga[Fan] = Saga("fanout", context="fan", data=Fan)

    @saga.map(
        items=lambda fan: list(range(fan.branches)), reply=PieceDone, concurrency=concurrency, limit=100_000
    )
    def piece(_data: Fan, n: int) -> Command:
        return command("fan_worker", Piece(n=n))

    return saga


def fanout_app(concurrency: int) -> App:
    worker = Participant("fan_worker", serves=["fan"])

    @worker.handles(Piece)
    async def handle(message: Piece, _ctx: CommandContext) -> PieceDone:
        return PieceDone(n=message.n)

    return App("bench-fanout", sagas=[fanout_saga(concurrency)], participants=[worker])


CONFLICTS = [0]


def count_conflicts() -> None:
    def counting(reply):  # type: ignore[no-untyped-def]
        result = commit_result(reply)
        CONFLICTS[0] += result.outcome == "conflict"
        return result

    orchestrator_module.commit_result = counting  # type: ignore[assignment]


async def run_fanout(url: str, branches: int, concurrency: int, procs: int) -> dict[str, object]:
    redis = bus.connect(url)
    await redis.flushdb()
    count_conflicts()
    app = fanout_app(concurrency)
    done = anyio.Event()
    worker = SagaWorker(redis, app, config=CONFIG)
    worker.observe(lambda state: done.set() if state.status.terminal else None)
    client = SagaClient(redis, app.registry, config=CONFIG)
    child = spawn_child(url, f"fanout:{concurrency}") if procs == 2 else None
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.started.wait()
        if child is not None:
            await wait_for_ready(child)
        COMMANDS[0], CONFLICTS[0] = 0, 0
        cpu, wall = time.process_time(), time.perf_counter()
        await client.start("fanout", Fan(branches=branches), saga_id="fan-1")
        while (await client.get("fan-1")).status != SagaStatus.COMPLETED:
            with anyio.move_on_after(0.2):
                await done.wait()
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        worker.stop()
    partition = Partition("fan", 0)
    saga_bytes = int(await redis.memory_usage(partition.saga("fan-1"), samples=0))
    branch_bytes = int(await redis.memory_usage(partition.branches("fan-1"), samples=0))
    commands, conflicts = COMMANDS[0], CONFLICTS[0]
    if child is not None:
        child.terminate()
        out, _ = child.communicate(timeout=30)
        stats = json.loads(out.strip().splitlines()[-1])
        commands += stats["commands"]
        cpu += stats["cpu_s"]
        conflicts += stats["conflicts"]
    return {
        "branches": branches,
        "concurrency": concurrency,
        "branches_per_s": round(branches / wall, 1),
        "conflicts_per_branch": round(conflicts / branches, 3),
        "cpu_us_per_branch": round(cpu / branches * 1e6, 1),
        "cmds_per_branch": round(commands / branches, 2),
        "saga_hash_bytes": saga_bytes,
        "branch_bytes": round(branch_bytes / branches),
    }


FLOOR_FAN_START = """
redis.call('HSET', KEYS[1], 'next', ARGV[2], 'done', 0, 'total', ARGV[1])
for n = 0, tonumber(ARGV[2]) - 1 do
  redis.call('XADD', KEYS[2], '*', 'n', n)
end
return 1
"""
FLOOR_FAN_REPLY = """
local total = tonumber(redis.call('HGET', KEYS[1], 'total'))
local done = redis.call('HINCRBY', KEYS[1], 'done', 1)
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
local next = tonumber(redis.call('HGET', KEYS[1], 'next'))
if next < total then
  redis.call('HSET', KEYS[1], 'next', next + 1)
  redis.call('XADD', KEYS[2], '*', 'n', next)
end
redis.call('XACK', KEYS[4], 'o', ARGV[1])
return done
"""


async def run_fanout_floor(url: str, branches: int, concurrency: int) -> dict[str, object]:
    """The least a fan-out can do: one script per reply records it and sends the next command."""
    redis = bus.connect(url)
    await redis.flushdb()
    saga, commands, results, inbox = (floor_key(k) for k in ("fan", "fancmd", "fanresults", "faninbox"))
    await redis.xgroup_create(commands, "p", id="0", mkstream=True)
    await redis.xgroup_create(inbox, "o", id="0", mkstream=True)
    start = redis.register_script(FLOOR_FAN_START)
    reply = redis.register_script(FLOOR_FAN_REPLY)
    participant_reply = redis.register_script(FLOOR_REPLY)
    finished = anyio.Event()

    async def participant() -> None:
        while True:
            batch = await redis.xreadgroup("p", "c", {commands: ">"}, count=100, block=1000)
            if not batch:
                continue
            async with redis.pipeline(transaction=False) as pipe:
                for entry_id, fields in batch[0][1]:
                    await participant_reply(
                        keys=[commands, inbox], args=[entry_id, "fan", fields[b"n"]], client=pipe
                    )
                await pipe.execute()

    async def orchestrator() -> None:
        while True:
            batch = await redis.xreadgroup("o", "c", {inbox: ">"}, count=100, block=1000)
            if not batch:
                continue
            async with redis.pipeline(transaction=False) as pipe:
                for entry_id, fields in batch[0][1]:
                    await reply(
                        keys=[saga, commands, results, inbox],
                        args=[entry_id, fields[b"step"], '{"type":"PieceDone"}'],
                        client=pipe,
                    )
                done = await pipe.execute()
            if max(done) >= branches:
                finished.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(participant)
        tg.start_soon(orchestrator)
        COMMANDS[0] = 0
        cpu, wall = time.process_time(), time.perf_counter()
        await start(keys=[saga, commands], args=[branches, concurrency])
        await finished.wait()
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        tg.cancel_scope.cancel()
    return {
        "branches": branches,
        "concurrency": concurrency,
        "branches_per_s": round(branches / wall, 1),
        "cpu_us_per_branch": round(cpu / branches * 1e6, 1),
        "cmds_per_branch": round(COMMANDS[0] / branches, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDSAGA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
    )
    parser.add_argument("--sagas", type=int, default=2000)
    parser.add_argument("--serial", type=int, default=300, help="sagas in the one-at-a-time shape")
    parser.add_argument("--shapes", default="burst,inflight100,serial")
    parser.add_argument("--procs", default="1,2")
    parser.add_argument("--branches", type=int, default=1000, help="branches of the fan-out saga")
    parser.add_argument("--fanout-concurrency", type=int, default=50)
    parser.add_argument("--signing", default="off", help="off, on, or off,on (both, signed lines '.signed')")
    parser.add_argument("--metrics", default="off", help="off, on, or off,on (lines '.metrics' with them on)")
    parser.add_argument("--tracing", default="off", help="off, on, or off,on (lines '.traced' with it on)")
    parser.add_argument(
        "--replica-acks", default="0", help="0, 1, or 0,1 (lines '.acks1' waiting for one replica)"
    )
    parser.add_argument(
        "--peers", default="", help="celery: also run the saga as a Celery chain (lines '.celery')"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    tune_gc()  # what `saga worker` does once loaded (docs/operations.md); both sides gain
    if args.child:
        anyio.run(child_main, args.child, args.redis_url, int(args.replica_acks))
        return
    for procs in [int(p) for p in args.procs.split(",")]:
        for shape in args.shapes.split(","):
            if shape == "fanout":
                width = args.fanout_concurrency
                result = anyio.run(run_fanout, args.redis_url, args.branches, width, procs)
                print(json.dumps({"name": f"saga.fanout.{procs}proc", **result}), flush=True)
                if procs == 1:
                    floor = anyio.run(run_fanout_floor, args.redis_url, args.branches, width)
                    print(json.dumps({"name": "saga.fanout.1proc.floor", **floor}), flush=True)
                continue
            count = args.serial if shape == "serial" else args.sagas
            for signing, metrics, tracing, acks in itertools.product(
                args.signing.split(","),
                args.metrics.split(","),
                args.tracing.split(","),
                [int(a) for a in args.replica_acks.split(",")],
            ):
                run = functools.partial(
                    run_redsaga,
                    signed=signing == "on",
                    metrics=metrics == "on",
                    traced=tracing == "on",
                    acks=acks,
                )
                result = anyio.run(run, args.redis_url, shape, count, procs, f"{shape}-")
                suffix = "".join(
                    name
                    for name, on in ((".signed", signing), (".metrics", metrics), (".traced", tracing))
                    if on == "on"
                ) + (f".acks{acks}" if acks else "")
                print(json.dumps({"name": f"saga.{shape}.{procs}proc{suffix}", **result}), flush=True)
            result = anyio.run(run_floor, args.redis_url, shape, count, procs, f"{shape}-")
            print(json.dumps({"name": f"saga.{shape}.{procs}proc.floor", **result}), flush=True)
            if "celery" in args.peers.split(",") and procs == 1:
                from celery_chain import run_celery  # noqa: PLC0415 -- needs the 'peers' extra

                result = anyio.run(run_celery, args.redis_url, shape, count, sys.modules[__name__])
                print(json.dumps({"name": f"saga.{shape}.1proc.celery", **result}), flush=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"name": "saga.bench.process", "max_rss_kb": usage.ru_maxrss}), flush=True)


if __name__ == "__main__":
    main()
