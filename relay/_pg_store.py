"""The relay's PostgreSQL store: ``FOR UPDATE SKIP LOCKED`` claims and ``LISTEN`` wake-ups.

Two connections: one for claims (a transaction per batch, holding the claimed rows' locks
while they are published, so several relays never publish the same row at once) and one in
autocommit mode that ``LISTEN``s on the outbox channel. The outbox's insert trigger
``NOTIFY``s at commit, so a relay waiting for work wakes as soon as a row is visible; the
poll interval is only the fallback (and covers NOTIFYs lost while reconnecting).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import psycopg
from psycopg import conninfo

from relay._config import RelayConfig
from relay._errors import DatabaseUnavailable, database_errors
from relay._publish import OutboxRow
from relay._schema import check_version
from relay._sql import Dialect, Statements, statements
from relay._store import Claimed, FailedRow, OutboxStats

# Keep dead links from hanging the relay: TCP keepalives, and a bounded connect.
CONNECT_OPTIONS: dict[str, Any] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "application_name": "redsaga-relay",
}
Connection = psycopg.AsyncConnection[tuple[Any, ...]]


class PostgresStore:
    """An outbox in PostgreSQL (see the module docstring)."""

    dialect: Dialect = "postgresql"

    def __init__(self, dsn: str, config: RelayConfig) -> None:
        self.dsn = dsn
        self.config = config
        self.sql: Statements = statements(config.tables, "postgresql")
        self._conn: Connection | None = None
        self._listen: Connection | None = None

    @property
    def database(self) -> str:
        """``host:port/dbname`` from the DSN (neither user nor password)."""
        params = conninfo.conninfo_to_dict(self.dsn)
        return f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}/{params.get('dbname', '')}"

    async def open(self) -> None:
        """Connect, check the schema version and ``LISTEN`` (when enabled)."""
        await self.close()
        with self._answered():
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, **CONNECT_OPTIONS)
            await check_schema(self._conn, self.config)
            if self.config.listen:
                self._listen = await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, **CONNECT_OPTIONS
                )
                await self._listen.execute(f"LISTEN {self.config.tables.channel}")

    async def close(self) -> None:
        """Close both connections (errors from already broken links are ignored)."""
        for conn in (self._conn, self._listen):
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
        self._conn = self._listen = None

    @contextlib.contextmanager
    def _answered(self) -> Iterator[None]:
        """Translate driver errors; give a statement up after ``db_timeout_s``.

        A link that answers nothing (half-open, blackholed) would hang the relay: TCP
        keepalives do not fire while a request is unanswered. Cancelling the statement
        makes psycopg close the connection, which rolls the open transaction back.
        """
        timeout = self.config.db_timeout_s
        try:
            with database_errors(), anyio.fail_after(timeout):
                yield
        except TimeoutError as error:
            raise DatabaseUnavailable(
                f"PostgreSQL did not answer within {timeout} s (RelayConfig.db_timeout_s): "
                "the link counts as dead; reconnecting"
            ) from error

    @property
    def conn(self) -> Connection:
        """The claim connection (open)."""
        if self._conn is None or self._conn.closed:
            raise psycopg.OperationalError("the relay's database connection is closed")
        return self._conn

    async def claim(self, limit: int) -> Claimed:
        """Lock and return up to ``limit`` publishable rows (see ``_sql.py`` for the query)."""
        with self._answered():
            cursor = await self.conn.execute(self.sql.claim, (limit,))
            found = await cursor.fetchall()
            rows = [OutboxRow(int(r[0]), r[1], r[2], r[3], bytes(r[4])) for r in found if not r[5]]
            if not rows:
                await self.conn.rollback()
        return Claimed(rows, held_back=len(found) - len(rows))

    async def finish(
        self, sent: Sequence[tuple[int, str | None]], failed: Sequence[tuple[int, str]], now_ms: int
    ) -> None:
        """Mark the batch and commit, releasing the rows' locks."""
        with self._answered():
            if sent:
                ids, entries = zip(*sent, strict=True)
                await self.conn.execute(self.sql.mark_sent, (now_ms, list(ids), list(entries)))
            if failed:
                ids, reasons = zip(*failed, strict=True)
                await self.conn.execute(self.sql.mark_failed, (now_ms, list(ids), list(reasons)))
            await self.conn.commit()

    async def release(self) -> None:
        """Roll back the claim (rows stay pending)."""
        if self._conn is not None and not self._conn.closed:
            with self._answered():
                await self._conn.rollback()

    async def wait(self, timeout_s: float) -> None:
        """Wait for a NOTIFY on the outbox channel, at most ``timeout_s``."""
        with database_errors():
            if self._listen is None or self._listen.closed:
                raise psycopg.OperationalError("the relay's LISTEN connection is closed")
            async for _ in self._listen.notifies(timeout=timeout_s, stop_after=1):
                pass

    async def has_pending(self) -> bool:
        """Whether any committed row is unsent."""
        return bool(await self._one(self.sql.pending_exists))

    async def purge(
        self, sent_before_ms: int | None, inbox_before_ms: int | None, chunk: int, archive: bool
    ) -> int:
        """Remove old sent rows and inbox keys, ``chunk`` rows per short transaction."""
        removed = 0
        statement = self.sql.archive_sent if archive else self.sql.purge_sent
        for cutoff, query in ((sent_before_ms, statement), (inbox_before_ms, self.sql.purge_inbox)):
            if cutoff is None:
                continue
            while True:
                with self._answered():
                    cursor = await self.conn.execute(query, (cutoff, chunk))
                    await self.conn.commit()
                removed += cursor.rowcount
                if cursor.rowcount < chunk:
                    break
        return removed

    async def stats(self, now_ms: int) -> OutboxStats:
        """Backlog figures from the pending index (no full scan), on a short connection of their own.

        Never on the claim connection: a read there, beside a round in flight, would run in
        (and its rollback end) the claim's transaction.
        """
        with self._answered():
            async with await psycopg.AsyncConnection.connect(self.dsn, **CONNECT_OPTIONS) as conn:
                return await read_stats(conn, self.sql, now_ms)

    async def failed_rows(self, limit: int) -> list[FailedRow]:
        """The oldest failed rows."""
        with self._answered():
            cursor = await self.conn.execute(self.sql.list_failed, (limit,))
            rows = await cursor.fetchall()
            await self.conn.rollback()
        return [failed_row(r) for r in rows]

    async def requeue(self, ids: Sequence[int]) -> int:
        """Mark failed rows pending again."""
        count = 0
        with self._answered():
            for row_id in ids:
                cursor = await self.conn.execute(self.sql.requeue, (row_id,))
                count += cursor.rowcount
            await self.conn.commit()
        return count

    async def _one(self, query: str) -> Any:
        with self._answered():
            cursor = await self.conn.execute(query)
            row = await cursor.fetchone()
            await self.conn.rollback()
        return row[0] if row else None


async def check_schema(conn: Connection, config: RelayConfig) -> None:
    """Raise :class:`SchemaMissing` unless the relay tables are at the current version."""
    found: int | None
    try:
        cursor = await conn.execute(statements(config.tables, "postgresql").schema_version)
        row = await cursor.fetchone()
        found = row[0] if row else None
    except psycopg.errors.UndefinedTable:
        found = None
    await conn.rollback()
    check_version(found, config.tables)


async def read_stats(conn: Connection, sql: Statements, now_ms: int) -> OutboxStats:
    """Read :class:`OutboxStats` on ``conn`` (one short read-only transaction)."""
    with database_errors():
        cursor = await conn.execute(sql.stats)
        pending = await cursor.fetchone()
        cursor = await conn.execute(sql.failed_count)
        failed = await cursor.fetchone()
        await conn.rollback()
    backlog, oldest = (int(pending[0]), pending[1]) if pending else (0, None)
    return OutboxStats(
        backlog=backlog,
        oldest_unsent_age_ms=None if oldest is None else max(0, now_ms - int(oldest)),
        failed=int(failed[0]) if failed else 0,
        checked_at_ms=now_ms,
    )


def failed_row(row: Sequence[Any]) -> FailedRow:
    """A ``list_failed`` result row as a :class:`FailedRow`."""
    return FailedRow(
        id=int(row[0]),
        message_id=str(row[1]),
        stream=str(row[2]),
        type=str(row[3]),
        error=str(row[4] or ""),
        failed_at_ms=int(row[5] or 0),
    )
