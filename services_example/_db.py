"""A service's own database for the demo: SQLite (default) or PostgreSQL.

The relay's inbox and outbox are written in the same transaction as the business change.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import psycopg

import relay
from bus import Envelope


class Transaction:
    """One open transaction: business SQL (``?`` placeholders), inbox and outbox writes."""

    def __init__(self, conn: sqlite3.Connection | psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Run one statement; return its rows (if it returns any)."""
        if isinstance(self._conn, sqlite3.Connection):
            return self._conn.execute(sql, params).fetchall()
        cursor = await self._conn.execute(sql.replace("?", "%s"), params)
        return await cursor.fetchall() if cursor.description else []

    async def receive(self, consumer: str, envelope: Envelope) -> relay.Received:
        """Record the command in the inbox (or find it was received before)."""
        received: relay.Received = await _maybe(relay.inbox.receive(self._conn, consumer, envelope))
        return received

    async def reply(self, received: relay.Received, message: object) -> None:
        """Record the reply and add it to the outbox."""
        await _maybe(relay.inbox.reply(self._conn, received, message))

    async def resend(self, received: relay.Received) -> None:
        """Add the first reply to the outbox again, for this delivery."""
        await _maybe(relay.inbox.resend(self._conn, received))


class Database:
    """The database at ``dsn`` (``sqlite:///path`` or ``postgresql://…``)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self._schema = schema
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.AsyncConnection[Any] | None = None
        self._one_at_a_time = anyio.Lock()  # one connection: transactions must not interleave

    async def open(self) -> None:
        """Create the relay's tables and the service's own (idempotent), and connect."""
        await relay.init_db(self.dsn)
        if self.dsn.startswith("sqlite:///"):
            self._sqlite = sqlite3.connect(self.dsn.removeprefix("sqlite:///"), isolation_level=None)
            self._sqlite.executescript(self._schema)
        else:
            self._pg = await psycopg.AsyncConnection.connect(self.dsn, autocommit=False)
            async with self._pg.transaction():
                await self._pg.execute(self._schema)

    async def close(self) -> None:
        """Close the connection."""
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            await self._pg.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        async with self._one_at_a_time, self._transaction() as tx:
            yield tx

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Transaction]:
        if self._sqlite is not None:
            self._sqlite.execute("BEGIN IMMEDIATE")
            try:
                yield Transaction(self._sqlite)
            except BaseException:
                self._sqlite.execute("ROLLBACK")
                raise
            self._sqlite.execute("COMMIT")
            return
        if self._pg is None:
            raise RuntimeError(f"database {self.dsn} is not open: await open() first")
        async with self._pg.transaction():
            yield Transaction(self._pg)


async def _maybe(value: Any) -> Any:
    """Await what the async drivers return; pass through what the sync ones return."""
    if hasattr(value, "__await__"):
        return await value
    return value
