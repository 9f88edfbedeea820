"""Opening the relay's store, the schema and the stats from a DSN.

``postgresql://…`` (or ``postgres://…``) is a libpq DSN. ``sqlite:///relative.db`` and
``sqlite:////absolute/path.db`` name a SQLite file, as SQLAlchemy spells them.
"""

from __future__ import annotations

import sqlite3
from typing import Final

import psycopg

from relay._config import RelayConfig, Tables
from relay._errors import InvalidDsn, database_errors
from relay._pg_store import CONNECT_OPTIONS, PostgresStore, read_stats
from relay._schema import init_postgres, init_sqlite
from relay._sql import Dialect, statements
from relay._sqlite_store import SqliteStore, require_file, sqlite_stats
from relay._store import OutboxStats, RelayStore

SQLITE_PREFIX: Final = "sqlite:///"
_PG_PREFIXES: Final = ("postgresql://", "postgres://")


def dialect_of(dsn: str) -> Dialect:
    """Which database ``dsn`` names, or :class:`~relay.InvalidDsn`."""
    if dsn.startswith(_PG_PREFIXES):
        return "postgresql"
    if dsn.startswith(SQLITE_PREFIX) and len(dsn) > len(SQLITE_PREFIX):
        return "sqlite"
    raise InvalidDsn(
        f"cannot open {_redacted(dsn)!r}: use postgresql://user@host:port/db or sqlite:///path/to/file.db"
    )


def sqlite_path(dsn: str) -> str:
    """The file a ``sqlite:///`` DSN names."""
    return dsn[len(SQLITE_PREFIX) :]


def open_store(dsn: str, config: RelayConfig) -> RelayStore:
    """Build (not yet open) the store for ``dsn``."""
    if dialect_of(dsn) == "postgresql":
        return PostgresStore(dsn, config)
    return SqliteStore(sqlite_path(dsn), config)


async def init_db(dsn: str, tables: Tables | None = None) -> list[int]:
    """Create or upgrade the relay's tables at ``dsn``; return the versions applied (idempotent)."""
    tables = tables or Tables()
    if dialect_of(dsn) == "sqlite":
        with database_errors():
            conn = sqlite3.connect(sqlite_path(dsn))
        try:
            return init_sqlite(conn, tables)
        finally:
            conn.close()
    with database_errors():
        async with await psycopg.AsyncConnection.connect(dsn, **CONNECT_OPTIONS) as pg:
            return await init_postgres(pg, tables)


async def outbox_stats(dsn: str, *, tables: Tables | None = None, now_ms: int | None = None) -> OutboxStats:
    """Read the outbox backlog and the age of its oldest unsent row at ``dsn``.

    ``now_ms`` defaults to the system clock. One short read on its own connection; safe to
    call while relays run.
    """
    import time  # noqa: PLC0415 - only for the default

    tables = tables or Tables()
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if dialect_of(dsn) == "sqlite":
        require_file(sqlite_path(dsn))
        with database_errors():
            conn = sqlite3.connect(sqlite_path(dsn))
            try:
                return sqlite_stats(conn, statements(tables, "sqlite"), now_ms)
            finally:
                conn.close()
    with database_errors():
        async with await psycopg.AsyncConnection.connect(dsn, **CONNECT_OPTIONS) as pg:
            return await read_stats(pg, statements(tables, "postgresql"), now_ms)


def _redacted(dsn: str) -> str:
    """``dsn`` without a password, for error messages (secrets are never logged)."""
    head, at, tail = dsn.rpartition("@")
    if not at or ":" not in head.partition("://")[2]:
        return dsn
    scheme, _, user_password = head.partition("://")
    return f"{scheme}://{user_password.partition(':')[0]}:***@{tail}"
