"""The relay's tables: versioned migrations, ``init_db`` and the DDL for hand-run migrations.

Each migration has a version, a description and the statements for each dialect. ``init_db``
applies the ones the database has not recorded, in one transaction, under a lock (an
advisory lock on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite), so running it twice or from two
processes at once is safe. Teams that manage their own migrations copy :func:`ddl`'s output
(also in ``docs/relay.md``) and insert the version rows themselves.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

import psycopg

from relay._config import Tables
from relay._errors import SchemaMissing, database_errors
from relay._sql import Dialect, render


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema version: what it adds, as statements per dialect."""

    version: int
    description: str
    postgresql: tuple[str, ...]
    sqlite: tuple[str, ...]

    def statements(self, dialect: Dialect) -> tuple[str, ...]:
        """The statements for ``dialect``."""
        return self.postgresql if dialect == "postgresql" else self.sqlite


def migrations(tables: Tables) -> list[Migration]:
    """Every migration, oldest first, for ``tables``."""
    t = tables
    pg_outbox = f"""CREATE TABLE {t.outbox} (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id    text     NOT NULL,             -- envelope id: the Redis publish dedupe key
    stream        text     NOT NULL,             -- destination stream key, rs:{{tag}}:name
    ordering_key  text,                          -- rows with one key are published in commit order
    type          text     NOT NULL,             -- message type (for operators)
    envelope      bytea    NOT NULL,             -- msgpack-encoded bus.Envelope
    created_at_ms bigint   NOT NULL,
    status        smallint NOT NULL DEFAULT 0,   -- 0 pending, 1 sent, 2 failed
    sent_at_ms    bigint,                        -- when it was sent (or failed)
    entry_id      text,                          -- the stream entry id (NULL if deduped)
    error         text                           -- why it failed
)"""
    sqlite_outbox = f"""CREATE TABLE {t.outbox} (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id    TEXT    NOT NULL,
    stream        TEXT    NOT NULL,
    ordering_key  TEXT,
    type          TEXT    NOT NULL,
    envelope      BLOB    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    status        INTEGER NOT NULL DEFAULT 0,
    sent_at_ms    INTEGER,
    entry_id      TEXT,
    error         TEXT
)"""
    inbox = f"""CREATE TABLE {t.inbox} (
    consumer       text   NOT NULL,              -- the handler (or group) that received it
    message_key    text   NOT NULL,              -- idempotency key, else the message id
    message_id     text   NOT NULL,              -- the first delivery's message id
    received_at_ms bigint NOT NULL,
    reply_type     text,                         -- the first reply, re-sent on redelivery
    reply_payload  {{blob}},
    PRIMARY KEY (consumer, message_key)
)"""
    pending = f"CREATE INDEX {t.outbox}_pending ON {t.outbox} (id) WHERE status = 0"
    inbox_age = f"CREATE INDEX {t.inbox}_received ON {t.inbox} (received_at_ms)"
    notify = f"""CREATE FUNCTION {t.outbox}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{t.channel}', '');
    RETURN NULL;
END $$"""
    return [
        Migration(
            version=1,
            description="outbox, archive and inbox tables (PostgreSQL: NOTIFY trigger on insert)",
            postgresql=(
                pg_outbox,
                pending,
                (
                    f"CREATE INDEX {t.outbox}_pending_key ON {t.outbox} (ordering_key, id) "
                    "WHERE status = 0 AND ordering_key IS NOT NULL"
                ),
                f"CREATE TABLE {t.archive} (LIKE {t.outbox})",
                inbox.format(blob="bytea"),
                inbox_age,
                notify,
                (
                    f"CREATE TRIGGER {t.outbox}_notify AFTER INSERT ON {t.outbox} "
                    f"FOR EACH STATEMENT EXECUTE FUNCTION {t.outbox}_notify()"
                ),
            ),
            sqlite=(
                sqlite_outbox,
                pending,
                sqlite_outbox.replace(f"TABLE {t.outbox}", f"TABLE {t.archive}").replace(
                    " AUTOINCREMENT", ""
                ),
                inbox.format(blob="BLOB"),
                inbox_age,
            ),
        ),
    ]


def latest_version(tables: Tables | None = None) -> int:
    """The schema version this code needs."""
    return migrations(tables or Tables())[-1].version


def _versions_table(tables: Tables, dialect: Dialect) -> str:
    number = "bigint" if dialect == "postgresql" else "INTEGER"
    return (
        f"CREATE TABLE IF NOT EXISTS {tables.versions} ("
        f"version integer PRIMARY KEY, description text NOT NULL, applied_at_ms {number} NOT NULL)"
    )


def ddl(dialect: Dialect, tables: Tables | None = None) -> str:
    """The full DDL of the latest schema for ``dialect``, with the version rows, as one script."""
    tables = tables or Tables()
    header = f"-- redsaga relay schema v{latest_version(tables)} ({dialect}), as 'saga relay ddl' prints it\n"
    parts = [header + _versions_table(tables, dialect)]
    for migration in migrations(tables):
        statements = list(migration.statements(dialect))
        statements[0] = f"-- v{migration.version}: {migration.description}\n{statements[0]}"
        parts.extend(statements)
        parts.append(
            f"INSERT INTO {tables.versions} (version, description, applied_at_ms) "
            f"VALUES ({migration.version}, '{migration.description}', 0)"
        )
    return ";\n\n".join(parts) + ";\n"


def init_sqlite(conn: sqlite3.Connection, tables: Tables | None = None) -> list[int]:
    """Apply missing migrations to a SQLite database (WAL mode on); return the versions applied."""
    tables = tables or Tables()
    with database_errors():
        conn.execute("PRAGMA journal_mode=WAL")
        previous = conn.isolation_level
        conn.isolation_level = None  # we issue BEGIN/COMMIT ourselves
        try:
            conn.execute("BEGIN IMMEDIATE")  # one initialiser at a time
            try:
                conn.execute(_versions_table(tables, "sqlite"))
                done = {row[0] for row in conn.execute(f"SELECT version FROM {tables.versions}")}
                applied = []
                for migration in migrations(tables):
                    if migration.version in done:
                        continue
                    for statement in migration.sqlite:
                        conn.execute(statement)
                    conn.execute(
                        f"INSERT INTO {tables.versions} VALUES (?, ?, ?)",
                        (migration.version, migration.description, _now_ms()),
                    )
                    applied.append(migration.version)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        finally:
            conn.isolation_level = previous
    return applied


async def init_postgres(
    conn: psycopg.AsyncConnection[tuple[object, ...]], tables: Tables | None = None
) -> list[int]:
    """Apply missing migrations on PostgreSQL in one transaction; return the versions applied."""
    tables = tables or Tables()
    with database_errors():
        async with conn.transaction():
            # Serialise concurrent init-db runs on this outbox (released at commit).
            await conn.execute("SELECT pg_advisory_xact_lock(%s::int4, 0)", (tables.lock_class,))
            await conn.execute(_versions_table(tables, "postgresql"))
            cursor = await conn.execute(f"SELECT version FROM {tables.versions}")
            done = {int(str(row[0])) for row in await cursor.fetchall()}
            applied = []
            for migration in migrations(tables):
                if migration.version in done:
                    continue
                for statement in migration.postgresql:
                    await conn.execute(statement)
                await conn.execute(
                    render(f"INSERT INTO {tables.versions} VALUES (?, ?, ?)", "postgresql"),
                    (migration.version, migration.description, _now_ms()),
                )
                applied.append(migration.version)
    return applied


def check_version(found: int | None, tables: Tables) -> None:
    """Raise :class:`SchemaMissing` unless the database is at the version this code needs."""
    needed = latest_version(tables)
    if found is None:
        raise SchemaMissing(
            f"no relay tables found ({tables.versions} is missing): run 'saga relay init-db --dsn …'"
        )
    if found < needed:
        raise SchemaMissing(
            f"relay schema is at v{found}, this code needs v{needed}: run 'saga relay init-db --dsn …'"
        )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
