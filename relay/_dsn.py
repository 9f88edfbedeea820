"""DSNs, and what the relay opens from one: its store, the schema, the stats, the failed rows.

A DSN names a SQLite file, ``sqlite:///relative.db`` or ``sqlite:////absolute/path.db`` as
SQLAlchemy spells them, or a PostgreSQL database as any libpq connection string, which
``psycopg.conninfo`` parses: a URI (``postgresql://app@db:5432/payments``, ``postgres://…``)
or keywords (``host=db dbname=payments user=app``). Every error names a DSN only through
:func:`redact`, with its password replaced by ``***``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final

import psycopg
from psycopg import conninfo

from relay._config import RelayConfig, Tables
from relay._errors import InvalidDsn, database_errors
from relay._pg_store import CONNECT_OPTIONS, PostgresStore
from relay._schema import init_postgres, init_sqlite
from relay._sql import Dialect
from relay._sqlite_store import SqliteStore
from relay._store import FailedRow, OutboxStats, RelayStore

SQLITE_PREFIX: Final = "sqlite:///"
_PG_SCHEMES: Final = frozenset({"postgresql", "postgres"})
_FORMS: Final = (
    "use postgresql://user@host:port/db, libpq keywords (host=… dbname=…) or sqlite:///path/to/file.db"
)
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# A URI's password: userinfo up to the first "@", as libpq reads it.
_URI_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/?#@:]*:)[^/?#@]*@")
# A keyword's or a URI query's password: a quoted value (with \-escapes) or up to a blank or "&".
_KEYWORD_PASSWORD = re.compile(r"(\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|[^\s&]*)", re.IGNORECASE)
_HIDDEN: Final = "***"


@dataclass(frozen=True, slots=True)
class Target:
    """What a DSN names: the dialect, and the SQLite path or the libpq connection string."""

    dialect: Dialect
    where: str


def parse_dsn(dsn: str) -> Target:
    """The database ``dsn`` names, or :class:`~relay.InvalidDsn` (which names it redacted)."""
    if dsn.startswith(SQLITE_PREFIX) and len(dsn) > len(SQLITE_PREFIX):
        return Target("sqlite", dsn[len(SQLITE_PREFIX) :])
    if not dsn.strip():
        raise InvalidDsn(f"the DSN is empty: {_FORMS}")
    scheme = _SCHEME.match(dsn)
    if scheme is not None and scheme.group(1) not in _PG_SCHEMES:
        name = scheme.group(1)
        kind = "a SQLite DSN names a file" if name == "sqlite" else f"{name}: is not supported"
        raise InvalidDsn(f"cannot open {redact(dsn)!r}: {kind}; {_FORMS}")
    try:
        conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as error:
        # psycopg quotes the text it could not parse, which may hold the password.
        detail = "not a libpq connection string" if redact(dsn) != dsn else _first_line(error)
        raise InvalidDsn(f"cannot open {redact(dsn)!r}: {detail}; {_FORMS}") from None
    return Target("postgresql", dsn)


def redact(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***`` (in the userinfo, a keyword or a URI query)."""
    hidden = _KEYWORD_PASSWORD.sub(rf"\g<1>{_HIDDEN}", _URI_PASSWORD.sub(rf"\g<1>{_HIDDEN}@", dsn))
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return hidden
    password = params.get("password")
    if password and str(password) in hidden:  # spelt in a way the patterns missed: rebuild it
        return conninfo.make_conninfo("", **{**params, "password": _HIDDEN})
    return hidden


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def open_store(dsn: str, config: RelayConfig) -> RelayStore:
    """Build (not yet open) the store for ``dsn``."""
    target = parse_dsn(dsn)
    if target.dialect == "postgresql":
        return PostgresStore(target.where, config)
    return SqliteStore(target.where, config)


async def init_db(dsn: str, tables: Tables | None = None) -> list[int]:
    """Create or upgrade the relay's tables at ``dsn``; return the versions applied (idempotent)."""
    tables = tables or Tables()
    target = parse_dsn(dsn)
    if target.dialect == "sqlite":
        with database_errors():
            conn = sqlite3.connect(target.where)
        try:
            return init_sqlite(conn, tables)
        finally:
            conn.close()
    with database_errors():
        async with await psycopg.AsyncConnection.connect(target.where, **CONNECT_OPTIONS) as pg:
            return await init_postgres(pg, tables)


async def outbox_stats(dsn: str, *, tables: Tables | None = None, now_ms: int | None = None) -> OutboxStats:
    """Read the outbox backlog and the age of its oldest unsent row at ``dsn``.

    ``now_ms`` defaults to the system clock. One short read on its own connection; safe to
    call while relays run.
    """
    import time  # noqa: PLC0415 - only for the default

    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    return await open_store(dsn, RelayConfig(tables=tables or Tables(), listen=False)).stats(now_ms)


async def failed_rows(dsn: str, *, tables: Tables | None = None, limit: int = 100) -> list[FailedRow]:
    """The oldest ``limit`` outbox rows at ``dsn`` the relay marked failed, with their reasons."""
    async with _opened(dsn, tables) as store:
        return await store.failed_rows(limit)


async def requeue_failed(dsn: str, ids: Sequence[int] | None = None, *, tables: Tables | None = None) -> int:
    """Mark failed rows at ``dsn`` pending again (``None``: every one); return how many."""
    async with _opened(dsn, tables) as store:
        if ids is None:
            ids = [row.id for row in await store.failed_rows(1_000_000)]
        return await store.requeue(ids)


@asynccontextmanager
async def _opened(dsn: str, tables: Tables | None) -> AsyncIterator[RelayStore]:
    store = open_store(dsn, RelayConfig(tables=tables or Tables(), listen=False))
    await store.open()
    try:
        yield store
    finally:
        await store.close()
