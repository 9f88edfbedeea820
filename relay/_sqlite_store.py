"""The relay's SQLite store: WAL mode, polling, and one relay per database file.

SQLite has one writer at a time, so row ids are handed out in commit order and a row never
commits behind a later id. The relay polls (SQLite has no NOTIFY) and takes an exclusive
``flock`` on ``<database>.relay-lock`` for its lifetime, so a second relay on the same file
refuses to start (:class:`~relay.RelayLocked`); the kernel drops the lock when the process
dies, even by SIGKILL. ``sqlite3`` calls block, so they run on a worker thread, one at a time.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio
import anyio.to_thread

from relay._config import RelayConfig
from relay._errors import RelayLocked, SchemaMissing, database_errors
from relay._pg_store import failed_row
from relay._publish import OutboxRow
from relay._schema import check_version
from relay._sql import Dialect, Statements, statements
from relay._store import Claimed, FailedRow, OutboxStats

T = TypeVar("T")


class SqliteStore:
    """An outbox in a SQLite file (see the module docstring)."""

    dialect: Dialect = "sqlite"

    def __init__(self, path: str, config: RelayConfig) -> None:
        self.path = path
        self.config = config
        self.sql = statements(config.tables, "sqlite")
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._limiter = anyio.CapacityLimiter(1)

    @property
    def database(self) -> str:
        """The SQLite file's path, as given."""
        return self.path

    async def _call(self, job: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            with database_errors():
                return job(self.conn)

        return await anyio.to_thread.run_sync(run, limiter=self._limiter)

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection."""
        if self._conn is None:
            raise sqlite3.OperationalError("the relay's database connection is closed")
        return self._conn

    async def open(self) -> None:
        """Take the relay lock, open the file in WAL mode and check the schema version."""
        await self.close()
        require_file(self.path)
        self._lock_fd = _lock(self.path)

        def connect() -> sqlite3.Connection:
            with database_errors():
                conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                conn.execute(f"PRAGMA busy_timeout = {int(self.config.sqlite_busy_timeout_ms)}")
                conn.execute("PRAGMA journal_mode = WAL")
                try:
                    row = conn.execute(self.sql.schema_version).fetchone()
                    found = row[0] if row else None
                except sqlite3.OperationalError:
                    found = None
                try:
                    check_version(found, self.config.tables)
                except BaseException:
                    conn.close()
                    raise
                return conn

        self._conn = await anyio.to_thread.run_sync(connect, limiter=self._limiter)

    async def close(self) -> None:
        """Close the connection and drop the relay lock."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await anyio.to_thread.run_sync(conn.close, limiter=self._limiter)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def claim(self, limit: int) -> Claimed:
        """The oldest ``limit`` pending rows (one relay per file: nothing to lock)."""

        def job(conn: sqlite3.Connection) -> Claimed:
            rows = conn.execute(self.sql.claim, (limit,)).fetchall()
            return Claimed([OutboxRow(int(r[0]), r[1], r[2], r[3], bytes(r[4])) for r in rows])

        return await self._call(job)

    async def finish(
        self, sent: Sequence[tuple[int, str | None]], failed: Sequence[tuple[int, str]], now_ms: int
    ) -> None:
        """Mark the batch in one write transaction."""

        def job(conn: sqlite3.Connection) -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(self.sql.mark_sent, [(now_ms, entry, row_id) for row_id, entry in sent])
                conn.executemany(
                    self.sql.mark_failed, [(now_ms, reason, row_id) for row_id, reason in failed]
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

        await self._call(job)

    async def release(self) -> None:
        """Nothing to give back: claims hold no transaction on SQLite."""

    async def wait(self, timeout_s: float) -> None:
        """Poll: sleep ``timeout_s`` (SQLite has no NOTIFY; the relay sleeps on its clock instead)."""
        await anyio.sleep(timeout_s)

    async def has_pending(self) -> bool:
        """Whether any row is unsent."""
        return bool(await self._call(lambda c: c.execute(self.sql.pending_exists).fetchone()[0]))

    async def purge(
        self, sent_before_ms: int | None, inbox_before_ms: int | None, chunk: int, archive: bool
    ) -> int:
        """Remove old sent rows (archiving them first if asked) and inbox keys, in chunks."""

        def job(conn: sqlite3.Connection) -> int:
            removed = 0
            for cutoff, queries in (
                (
                    sent_before_ms,
                    [self.sql.archive_sent, self.sql.purge_sent] if archive else [self.sql.purge_sent],
                ),
                (inbox_before_ms, [self.sql.purge_inbox]),
            ):
                if cutoff is None:
                    continue
                while True:
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        count = 0
                        for query in queries:
                            count = conn.execute(query, (cutoff, chunk)).rowcount
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    removed += count
                    if count < chunk:
                        break
            return removed

        return await self._call(job)

    async def stats(self, now_ms: int) -> OutboxStats:
        """Backlog figures, on a short connection of their own (open or not, the store is not used)."""
        require_file(self.path)

        def read() -> OutboxStats:
            with database_errors():
                conn = sqlite3.connect(self.path)
                try:
                    return sqlite_stats(conn, self.sql, now_ms)
                finally:
                    conn.close()

        return await anyio.to_thread.run_sync(read)

    async def failed_rows(self, limit: int) -> list[FailedRow]:
        """The oldest failed rows."""
        rows = await self._call(lambda c: c.execute(self.sql.list_failed, (limit,)).fetchall())
        return [failed_row(r) for r in rows]

    async def requeue(self, ids: Sequence[int]) -> int:
        """Mark failed rows pending again."""

        def job(conn: sqlite3.Connection) -> int:
            with conn:
                return sum(conn.execute(self.sql.requeue, (row_id,)).rowcount for row_id in ids)

        return await self._call(job)


def require_file(path: str) -> None:
    """Raise :class:`SchemaMissing` when the database file does not exist (never create one)."""
    if not os.path.exists(path):  # noqa: PTH110 - paths stay strings, as sqlite3 takes them
        raise SchemaMissing(f"SQLite database {path} does not exist: run 'saga relay init-db --dsn …'")


def _lock(path: str) -> int:
    """Take the exclusive relay lock of ``path`` or raise :class:`RelayLocked`."""
    lock_path = f"{path}.relay-lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RelayLocked(
            f"another relay already serves {path} (it holds {lock_path}); "
            "run one relay per SQLite file, or stop the other one first"
        ) from None
    return fd


def sqlite_stats(conn: sqlite3.Connection, sql: Statements, now_ms: int) -> OutboxStats:
    """Read :class:`OutboxStats` on ``conn``."""
    backlog, oldest = conn.execute(sql.stats).fetchone()
    (failed,) = conn.execute(sql.failed_count).fetchone()
    return OutboxStats(
        backlog=int(backlog),
        oldest_unsent_age_ms=None if oldest is None else max(0, now_ms - int(oldest)),
        failed=int(failed),
        checked_at_ms=now_ms,
    )
