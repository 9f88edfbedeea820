"""The crash saga of ``tests/saga/crash_app.py`` with its effects kept in PostgreSQL.

Run as a worker process: ``python -m tests.faults.server_app``. Server faults make Redis
forget writes (a lost AOF tail, a failover to a lagging replica), so effects recorded in
that same Redis would be forgotten with them; here they live in PostgreSQL, as a real
participant's would. The handler stores the idempotency key and the effect in one
transaction and skips the effect when the key is there already (FAULTS.md G2); the
``effects`` table has no unique key, so a duplicate the dedupe missed shows up as two rows.

Environment: ``SERVER_FAULTS_REDIS_URL``, ``SERVER_FAULTS_PG_DSN``, ``SERVER_FAULTS_TABLE``
(the prefix of this run's tables: ``<prefix>_applied``, ``<prefix>_effects`` and
``<prefix>_runs``, one row per handler run, so a test can see that a fault made work re-run).
"""

from __future__ import annotations

import os

import anyio
import psycopg

import bus
from saga import App, CommandContext, Participant, SagaWorker
from tests.saga.crash_app import CONFIG, Do, Done, Undo, crash

URL_ENV, DSN_ENV, TABLE_ENV = "SERVER_FAULTS_REDIS_URL", "SERVER_FAULTS_PG_DSN", "SERVER_FAULTS_TABLE"
participant = Participant("worker", serves=["crashctx"])
_db: list[psycopg.AsyncConnection[tuple[object, ...]]] = []


def create_tables(conn: psycopg.Connection[tuple[object, ...]], prefix: str) -> None:
    """Create this run's tables (the test does it before any worker starts)."""
    conn.execute(f"CREATE TABLE {prefix}_applied (key text PRIMARY KEY)")
    conn.execute(f"CREATE TABLE {prefix}_effects (n bigserial, key text NOT NULL)")
    conn.execute(f"CREATE TABLE {prefix}_runs (key text NOT NULL)")


def drop_tables(conn: psycopg.Connection[tuple[object, ...]], prefix: str) -> None:
    """Drop this run's tables."""
    conn.execute(f"DROP TABLE IF EXISTS {prefix}_applied, {prefix}_effects, {prefix}_runs")


async def record(key: str) -> None:
    """Apply the effect of ``key`` at most once: key and effect commit together."""
    prefix = os.environ[TABLE_ENV]
    # one statement, so concurrent handlers can share the connection
    await _db[0].execute(
        f"WITH run AS (INSERT INTO {prefix}_runs (key) VALUES (%s)), "
        f"new AS (INSERT INTO {prefix}_applied (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING key) "  # type: ignore[arg-type]
        f"INSERT INTO {prefix}_effects (key) SELECT key FROM new",
        (key, key),
    )


@participant.handles(Do)
async def handle_do(message: Do, ctx: CommandContext) -> Done:
    if message.fail:
        raise bus.PermanentError(f"{message.step} refused {ctx.saga_id}")
    await record(ctx.idempotency_key)
    return Done(step=message.step)


@participant.handles(Undo)
async def handle_undo(message: Undo, ctx: CommandContext) -> Done:
    await record(ctx.idempotency_key)
    return Done(step=message.step)


app = App("server-faults-worker", sagas=[crash], participants=[participant])


async def main() -> None:
    """Run a worker until killed; a worker that stops on its own exits with its error."""
    _db.append(await psycopg.AsyncConnection.connect(os.environ[DSN_ENV], autocommit=True))
    await SagaWorker(bus.connect(os.environ[URL_ENV]), app, config=CONFIG).run()


if __name__ == "__main__":
    anyio.run(main)
