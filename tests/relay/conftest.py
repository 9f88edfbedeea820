"""Relay fixtures: outbox databases (SQLite files and PostgreSQL tables unique to each test).

Every PostgreSQL test gets its own table set (``t<random>_outbox``, …) in the session's database
(see ``tests/conftest.py``), dropped afterwards, so tests never see each other's rows.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import psycopg
import pytest

import bus
import relay
from tests import conftest

T = TypeVar("T")


@dataclass
class OutboxDb:
    """One outbox database for a test: its DSN, tables and a way to open plain connections."""

    dialect: str
    dsn: str
    tables: relay.Tables

    def connect(self) -> Any:
        """A plain sync connection (sqlite3 or psycopg) in its driver's default transaction mode."""
        if self.dialect == "sqlite":
            return sqlite3.connect(self.dsn.removeprefix("sqlite:///"))
        return psycopg.connect(self.dsn)

    def query(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        """Run ``sql`` (``{outbox}``/``{inbox}``/``{archive}`` filled in) and return its rows."""
        sql = sql.format(outbox=self.tables.outbox, inbox=self.tables.inbox, archive=self.tables.archive)
        conn = self.connect()
        try:
            if self.dialect == "postgresql":
                sql = sql.replace("?", "%s")
            cursor = conn.execute(sql, params)
            rows = list(cursor.fetchall()) if cursor.description else []
            conn.commit()
            return rows
        finally:
            conn.close()

    def config(self, **overrides: Any) -> relay.RelayConfig:
        """A relay config for these tables (fast polling for tests)."""
        options: dict[str, Any] = {"tables": self.tables, "poll_interval_s": 0.05}
        options.update(overrides)
        return relay.RelayConfig(**options)


def _drop_pg_tables(dsn: str, tables: relay.Tables) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in (tables.outbox, tables.inbox, tables.archive, tables.versions):
            conn.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
        conn.execute(f"DROP FUNCTION IF EXISTS {tables.outbox}_notify() CASCADE")


def in_thread(function: Callable[..., Awaitable[T]], *args: object) -> T:
    """Run an async function to completion from sync code, even under a running event loop."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, function, *args).result()


@pytest.fixture
def sqlite_db(tmp_path: Path) -> OutboxDb:
    db = OutboxDb("sqlite", f"sqlite:///{tmp_path / 'outbox.db'}", relay.Tables())
    in_thread(relay.init_db, db.dsn, db.tables)
    return db


@pytest.fixture
def postgres_db(pg_dsn: str) -> Iterator[OutboxDb]:
    tables = relay.Tables.prefixed(f"t{uuid.uuid4().hex[:10]}")
    in_thread(relay.init_db, pg_dsn, tables)
    try:
        yield OutboxDb("postgresql", pg_dsn, tables)
    finally:
        _drop_pg_tables(pg_dsn, tables)


@pytest.fixture(params=["sqlite", "postgresql"])
def outbox_db(request: pytest.FixtureRequest) -> OutboxDb:
    """The contract fixture: each test using it runs on SQLite and on PostgreSQL."""
    name = "sqlite_db" if request.param == "sqlite" else "postgres_db"
    db: OutboxDb = request.getfixturevalue(name)
    return db


@pytest.fixture(params=["single", pytest.param("cluster", marks=pytest.mark.cluster)])
async def relay_redis(request: pytest.FixtureRequest, outbox_db: OutboxDb) -> AsyncIterator[bus.Redis]:
    """The session's real Redis for PostgreSQL runs, fakeredis for SQLite runs; and the test
    cluster for both (tests/cluster.py), where each hash tag's publish call goes to its master."""
    if request.param == "cluster":
        from tests.cluster import flush, shared_cluster

        client = bus.connect(shared_cluster().url)
        await flush(client)
    elif outbox_db.dialect == "postgresql":
        conftest.require_server("Redis", conftest.REDIS_URL)
        client = bus.connect(conftest.REDIS_URL)
        await client.flushdb()
    else:
        client = bus.connect(bus.MEMORY_URL)
    try:
        yield client
    finally:
        await client.aclose()
