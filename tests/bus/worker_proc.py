"""A worker process for the fault tests: a payments participant whose effects land in PostgreSQL.

Run as ``python -m tests.bus.worker_proc --redis-url … --pg-dsn … --consumer NAME`` from the
repository root. It logs JSON lines to stdout (one per structlog event, plus ``ready`` once
the worker reads), and stops gracefully on SIGTERM through :meth:`bus.Worker.serve`.

The participant is idempotent the way a real one is: the effect row and the idempotency
key go in one transaction (a UNIQUE key), and every call appends to an attempts log with
its outcome (``started``, ``applied``, ``duplicate``), so a test counts effects and sees
who did what on which delivery. Behaviours a test picks:

- ``ok``     handle every command;
- ``hold``   after the ``started`` row (``--hold-at before``) or after the effect
             (``--hold-at after``), wait until the Redis key ``faults:gate`` exists;
- ``raise``  the command for ``--poison`` always raises (with a cause, for the error chain);
- ``crash``  the command for ``--poison`` kills this process (SIGKILL) on every delivery.
"""

from __future__ import annotations

import argparse
import os
import signal

import anyio
import msgspec
import psycopg
import structlog

import bus
from bus import Bus, BusConfig, ClientConfig, Delivery, Stream, Worker
from redsaga.cli._logging import configure

COMMANDS = Stream("shop:0", "cmd:payments")
REPLIES = Stream("shop:0", "inbox")
GATE_KEY = "faults:gate"

SCHEMA = """
CREATE TABLE IF NOT EXISTS fault_effects (
    idem_key text PRIMARY KEY,
    order_id text NOT NULL,
    consumer text NOT NULL,
    receipt  text NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_attempts (
    seq      bigserial PRIMARY KEY,
    idem_key text NOT NULL,
    order_id text NOT NULL,
    consumer text NOT NULL,
    entry_id text NOT NULL,
    delivery int  NOT NULL,
    outcome  text NOT NULL
);
"""


class Charge(msgspec.Struct, tag=True):
    """The command the fault tests send."""

    order: str
    amount: int


class Charged(msgspec.Struct, tag=True):
    """The participant's reply: the receipt of the one effect."""

    order: str
    receipt: str


class Ledger:
    """The participant's database: effects (UNIQUE idempotency key) and an attempts log."""

    def __init__(self, connection: psycopg.AsyncConnection[tuple[object, ...]], consumer: str) -> None:
        self._connection = connection
        self._consumer = consumer
        self._lock = anyio.Lock()  # one connection: one transaction at a time

    async def attempt(self, command: Charge, delivery: Delivery, outcome: str) -> None:
        """Append to the attempts log."""
        async with self._lock, self._connection.transaction():
            await self._log(command, delivery, outcome)

    async def apply(self, command: Charge, delivery: Delivery) -> str:
        """Apply the effect once per idempotency key; return the receipt of the one effect."""
        key = delivery.envelope.idempotency_key
        async with self._lock, self._connection.transaction():
            cursor = await self._connection.execute(
                "INSERT INTO fault_effects (idem_key, order_id, consumer, receipt) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (idem_key) DO NOTHING RETURNING receipt",
                (key, command.order, self._consumer, f"receipt-{command.order}-{self._consumer}"),
            )
            row = await cursor.fetchone()
            if row is None:
                cursor = await self._connection.execute(
                    "SELECT receipt FROM fault_effects WHERE idem_key = %s", (key,)
                )
                row = await cursor.fetchone()
                assert row is not None
                await self._log(command, delivery, "duplicate")
            else:
                await self._log(command, delivery, "applied")
            return str(row[0])

    async def _log(self, command: Charge, delivery: Delivery, outcome: str) -> None:
        await self._connection.execute(
            "INSERT INTO fault_attempts (idem_key, order_id, consumer, entry_id, delivery, outcome)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (
                delivery.envelope.idempotency_key,
                command.order,
                self._consumer,
                delivery.entry_id,
                delivery.deliveries,
                outcome,
            ),
        )


def build_app(args: argparse.Namespace, ledger: Ledger, redis: bus.Redis) -> Bus:
    """The payments participant with the behaviour the test asked for."""
    app = Bus("payments")

    async def hold() -> None:
        while not await redis.exists(GATE_KEY):
            await anyio.sleep(0.02)  # a test participant waiting for the test's go-ahead

    @app.handler(COMMANDS, Charge)
    async def charge(command: Charge, delivery: Delivery) -> Charged:
        await ledger.attempt(command, delivery, "started")
        if command.order == args.poison:
            if args.behaviour == "raise":
                try:
                    raise ValueError(f"card number for {command.order} is garbage")
                except ValueError as error:
                    raise RuntimeError("card gateway refused the charge") from error
            if args.behaviour == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
        if args.behaviour == "hold" and args.hold_at == "before":
            await hold()
        receipt = await ledger.apply(command, delivery)
        if args.behaviour == "hold" and args.hold_at == "after":
            await hold()
        if args.work_ms:
            await anyio.sleep(args.work_ms / 1000)  # stands for the participant's own I/O
        return Charged(order=command.order, receipt=receipt)

    return app


async def main(args: argparse.Namespace) -> None:
    """Connect, run the worker until SIGTERM, exit."""
    configure(json_logs=True, level="debug")
    redis = bus.connect(args.redis_url, ClientConfig(client_name=f"fault-{args.consumer}"))
    config = BusConfig(
        concurrency=args.concurrency,
        block_ms=200,
        lease_ms=args.lease_ms,
        reclaim_interval_ms=200,
        max_deliveries=args.max_deliveries,
        retry_base_ms=50,
        retry_max_ms=200,
        shutdown_grace_s=args.grace_s,
        maintenance_interval_ms=3_600_000,
    )
    async with await psycopg.AsyncConnection.connect(args.pg_dsn, autocommit=True) as connection:
        await connection.execute(SCHEMA)
        ledger = Ledger(connection, args.consumer)
        worker = Worker(redis, build_app(args, ledger, redis), config=config, consumer=args.consumer)
        async with anyio.create_task_group() as group:

            async def announce() -> None:
                await worker.started.wait()
                structlog.get_logger("worker_proc").info("ready", pid=os.getpid())

            group.start_soon(announce)
            await worker.serve()
            group.cancel_scope.cancel()
    await redis.aclose()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--pg-dsn", required=True)
    parser.add_argument("--consumer", required=True)
    parser.add_argument("--behaviour", choices=["ok", "hold", "raise", "crash"], default="ok")
    parser.add_argument("--hold-at", choices=["before", "after"], default="before")
    parser.add_argument("--poison", default="")
    parser.add_argument("--lease-ms", type=int, default=1_000)
    parser.add_argument("--max-deliveries", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--work-ms", type=int, default=0)
    parser.add_argument("--grace-s", type=float, default=10.0)
    return parser.parse_args(argv)


if __name__ == "__main__":
    anyio.run(main, parse())
