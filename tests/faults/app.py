"""The saga fault app, run as a worker process: ``python -m tests.faults.app``.

An order-like saga of five steps, each with a compensation, and a ``napper`` saga (a durable
sleep, then one step) for timer faults. Both call the ``shop`` participant, which records
every effect the way invariant G2 (docs/faults.md) asks of a real participant: the effect row and its
idempotency key (UNIQUE) are written in one PostgreSQL transaction whose insert *is* the
dedupe check, and every handler call is appended to an attempts log first, so a test counts
effects instead of trusting the bus (see ``tests/faults/checker.py``).

What goes wrong is chosen per saga through its data (:class:`Order`): a step that fails for
good, a compensation that fails ``n`` times (or always), a step that always raises, a step
whose handler kills the process on the saga's first attempt, a step that waits for a gate
key (to stall a worker mid-handler) and a step that computes longer than the lease.

Environment: ``FAULTS_REDIS_URL``, ``FAULTS_PG_DSN``, ``FAULTS_SCHEMA`` (the test's own
PostgreSQL schema), ``FAULTS_CONSUMER`` (the worker's consumer name) and the crash point in
``REDSAGA_CRASH_AT``. Logs are JSON lines on stdout, with ``ready`` once the worker reads.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, Final

import anyio
import msgspec
import psycopg

import bus
from redsaga.cli._logging import configure
from saga import (
    App,
    Command,
    CommandContext,
    Context,
    EngineConfig,
    Participant,
    Retry,
    Saga,
    SagaStatus,
    SagaWorker,
    StepContext,
    command,
)
from tests.faults.procs import serve_until_killed

STEPS: Final = ("reserve", "charge", "pack", "ship", "invoice")
PARTITIONS_ENV: Final = "FAULTS_PARTITIONS"
"""The fault context's partition count in a worker process (default 1): a test that spreads
the load over a cluster's masters gives its workers more (``open_scenario(partitions=…)``)."""
CONTEXT: Final = Context("faultctx", partitions=int(os.environ.get(PARTITIONS_ENV) or 1))
PARTICIPANT: Final = "shop"
FOREVER: Final = -1
"""``Order.undo_fails`` value: the compensation fails on every attempt."""
LEASE_MS: Final = 1_500
MAX_DELIVERIES: Final = 4
DO_RETRY: Final = Retry(attempts=8, initial=0.05, max_delay=0.5)
UNDO_RETRY: Final = Retry(attempts=4, initial=0.05, max_delay=0.2)
STEP_TIMEOUT_S: Final = 10

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS effects (
    seq      bigserial PRIMARY KEY,
    idem_key text NOT NULL UNIQUE,
    saga_id  text NOT NULL,
    step     text NOT NULL,
    kind     text NOT NULL,
    worker   text NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS attempts (
    seq      bigserial PRIMARY KEY,
    idem_key text NOT NULL,
    saga_id  text NOT NULL,
    step     text NOT NULL,
    kind     text NOT NULL,
    attempt  int  NOT NULL,
    delivery int  NOT NULL,
    worker   text NOT NULL,
    phase    text NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""
"""``attempts.phase``: ``call`` when a handler starts, then ``applied`` or ``duplicate``."""


def gate_key(saga_id: str) -> str:
    """The Redis key a ``hold`` step's handler waits for."""
    return f"faults:gate:{saga_id}"


class Order(msgspec.Struct, frozen=True, kw_only=True):
    """A saga's data, with the faults its participant should inject."""

    id: str
    fail_step: str = ""
    """This step fails permanently (the completed steps are compensated)."""
    undo_fails: dict[str, int] = msgspec.field(default_factory=dict)
    """step -> how many attempts of its compensation fail (``FOREVER``: all of them)."""
    raise_step: str = ""
    """This step's handler always raises (a transient error): retries run out."""
    crash_step: str = ""
    """This step's handler kills its worker process on every delivery of attempt 1."""
    hold_step: str = ""
    """This step's handler waits for :func:`gate_key` before applying its effect."""
    spin_step: str = ""
    """This step's handler computes for ``spin_ms`` (in a worker thread) before its effect."""
    spin_ms: int = 0


def expected_end(data: Order) -> SagaStatus:
    """The end state an ``order`` saga must reach, whatever happens to the processes."""
    for index, step in enumerate(STEPS):
        if step == data.fail_step:  # refused before anything else is tried
            done = STEPS[:index]
            if not done:
                return SagaStatus.FAILED
            if any(data.undo_fails.get(s) == FOREVER for s in done):
                return SagaStatus.DEAD_LETTERED
            return SagaStatus.COMPENSATED
        if step == data.raise_step:
            return SagaStatus.DEAD_LETTERED  # its retries run out; nothing is undone
    return SagaStatus.COMPLETED


def implied_effects(data: Order, status: SagaStatus) -> list[tuple[str, str]] | None:
    """The effects, as ``(step, kind)`` in order of application, that an ``order`` saga
    ending in ``status`` must have left in PostgreSQL (``None``: that end leaves them open).

    A completed saga applied every step; otherwise the steps before the first failing or
    raising one, then (when a step was refused) their undos in reverse order, up to the first
    compensation that fails for good.
    """
    if status == SagaStatus.COMPLETED:
        return [(step, "do") for step in STEPS]
    stops = [i for i, step in enumerate(STEPS) if step in (data.fail_step, data.raise_step)]
    if not stops:
        return None
    done = STEPS[: stops[0]]
    if STEPS[stops[0]] != data.fail_step:  # a step that raises: its retries run out, nothing is undone
        return [(step, "do") for step in done]
    undone: list[str] = []
    for step in reversed(done):
        if data.undo_fails.get(step) == FOREVER:
            break
        undone.append(step)
    return [(step, "do") for step in done] + [(step, "undo") for step in undone]


class Do(msgspec.Struct, tag=True, frozen=True):
    step: str
    order: Order


class Undo(msgspec.Struct, tag=True, frozen=True):
    step: str
    fails: int = 0


class Done(msgspec.Struct, tag=True, frozen=True):
    step: str


def _declare(definition: Saga[Any], step: str) -> None:
    def do(data: Order) -> Command:
        return command(PARTICIPANT, Do(step=step, order=data))

    def undo(data: Order, _ctx: StepContext) -> Command:
        return command(PARTICIPANT, Undo(step=step, fails=data.undo_fails.get(step, 0)))

    do.__name__, undo.__name__ = step, f"undo_{step}"
    definition.step(reply=Done, compensate=f"undo_{step}", retry=DO_RETRY, timeout=STEP_TIMEOUT_S)(do)
    definition.compensation(retry=UNDO_RETRY)(undo)


class Nap(msgspec.Struct, frozen=True):
    """The data of a ``napper`` saga: sleep ``ms``, then one step."""

    id: str
    ms: int = 0


def woke(data: Nap) -> Command:
    return command(PARTICIPANT, Do(step="woke", order=Order(id=data.id)))


def sagas(context: Context) -> tuple[Saga[Order], Saga[Nap]]:
    """The ``order`` and ``napper`` sagas in ``context`` (the fault context, with its partitions)."""
    order: Saga[Order] = Saga("order", version=1, context=context, data=Order)
    for step in STEPS:
        _declare(order, step)
    napper: Saga[Nap] = Saga("napper", version=1, context=context, data=Nap)
    napper.sleep("nap", lambda data: timedelta(milliseconds=data.ms))
    napper.step(reply=Done, retry=DO_RETRY, timeout=STEP_TIMEOUT_S)(woke)
    return order, napper


order, napper = sagas(CONTEXT)


class Ledger:
    """The participant's PostgreSQL tables, over a few connections (one transaction each)."""

    def __init__(self, connections: list[psycopg.AsyncConnection[tuple[Any, ...]]], worker: str) -> None:
        self.worker = worker
        self._free = list(connections)
        self._available = anyio.Semaphore(len(connections))

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[tuple[Any, ...]]]:
        async with self._available:
            connection = self._free.pop()
            try:
                yield connection
            finally:
                self._free.append(connection)

    async def log(self, ctx: CommandContext, step: str, phase: str) -> None:
        """Append one row to the attempts log (its own transaction: it survives a later crash)."""
        async with self._connection() as connection:
            await connection.execute(
                "INSERT INTO attempts (idem_key, saga_id, step, kind, attempt, delivery, worker, phase)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (ctx.idempotency_key, ctx.saga_id, step, ctx.kind, ctx.attempt, ctx.delivery.deliveries,
                 self.worker, phase),
            )  # fmt: skip

    async def apply(self, ctx: CommandContext, step: str) -> None:
        """Apply the effect once per idempotency key: the insert is the dedupe check."""
        async with self._connection() as connection, connection.transaction():
            cursor = await connection.execute(
                "INSERT INTO effects (idem_key, saga_id, step, kind, worker) VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (idem_key) DO NOTHING RETURNING seq",
                (ctx.idempotency_key, ctx.saga_id, step, ctx.kind, self.worker),
            )
            applied = await cursor.fetchone() is not None
            await connection.execute(
                "INSERT INTO attempts (idem_key, saga_id, step, kind, attempt, delivery, worker, phase)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (ctx.idempotency_key, ctx.saga_id, step, ctx.kind, ctx.attempt, ctx.delivery.deliveries,
                 self.worker, "applied" if applied else "duplicate"),
            )  # fmt: skip


def _spin(ms: int) -> int:
    """CPU-bound work for ``ms`` milliseconds (no sleeping: the CPU is busy)."""
    deadline, rounds = time.monotonic() + ms / 1000, 0
    while time.monotonic() < deadline:
        rounds += sum(range(1_000)) & 1
    return rounds


def participant(ledger: Ledger, redis: bus.Redis) -> Participant:
    """The ``shop`` participant, injecting what each saga's data asks for."""
    shop = Participant(PARTICIPANT, serves=[CONTEXT])

    @shop.handles(Do)
    async def on_do(message: Do, ctx: CommandContext) -> Done:
        await ledger.log(ctx, message.step, "call")
        data = message.order
        if message.step == data.fail_step:
            raise bus.PermanentError(f"{message.step} refused for {ctx.saga_id}")
        if message.step == data.raise_step:
            try:
                raise ValueError(f"{message.step} input for {ctx.saga_id} is garbage")
            except ValueError as error:
                raise RuntimeError(f"{message.step} backend refused") from error
        if message.step == data.crash_step and ctx.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        if message.step == data.hold_step:
            while not await redis.exists(gate_key(ctx.saga_id)):
                await anyio.sleep(0.02)  # a test participant polling for the test's go-ahead
        if message.step == data.spin_step:
            await anyio.to_thread.run_sync(_spin, data.spin_ms)
        await ledger.apply(ctx, message.step)
        return Done(step=message.step)

    @shop.handles(Undo)
    async def on_undo(message: Undo, ctx: CommandContext) -> Done:
        await ledger.log(ctx, message.step, "call")
        if message.fails == FOREVER or ctx.attempt <= message.fails:
            raise RuntimeError(f"undo {message.step} failed on attempt {ctx.attempt}")
        await ledger.apply(ctx, message.step)
        return Done(step=message.step)

    return shop


def build(ledger: Ledger, redis: bus.Redis) -> App:
    """The app a worker runs."""
    return App("faults", sagas=[order, napper], participants=[participant(ledger, redis)])


REGISTRY: Final = App("faults-client", sagas=[order, napper]).registry
"""What a test's :class:`~saga.SagaClient` needs (no participant)."""
CONFIG: Final = EngineConfig(
    bus=bus.BusConfig(
        concurrency=32,
        lease_ms=LEASE_MS,
        reclaim_interval_ms=300,
        block_ms=200,
        retry_base_ms=50,
        max_deliveries=MAX_DELIVERIES,
        shutdown_grace_s=2,
    ),
)


async def main() -> None:
    """Run one worker until SIGTERM (graceful) or SIGKILL."""
    configure(json_logs=True, level="info")  # per-transition debug lines cost CPU
    consumer = os.environ["FAULTS_CONSUMER"]
    redis = bus.connect(os.environ["FAULTS_REDIS_URL"], bus.ClientConfig(client_name=f"faults-{consumer}"))
    options = f"-c search_path={os.environ['FAULTS_SCHEMA']}"
    connections = [
        await psycopg.AsyncConnection.connect(os.environ["FAULTS_PG_DSN"], autocommit=True, options=options)
        for _ in range(4)
    ]
    worker = SagaWorker(redis, build(Ledger(connections, consumer), redis), config=CONFIG, consumer=consumer)
    await serve_until_killed(worker, "faults.app")


if __name__ == "__main__":
    anyio.run(main)
