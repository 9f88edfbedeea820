"""Running the outbox's and inbox's statements on whatever connection the caller holds.

The writers are *plans*: generators that yield a :class:`Query` and receive its rows, with no
I/O of their own. :func:`run` drives a plan on ``sqlite3``, psycopg 3 (sync or async), or a
SQLAlchemy 2 ``Session``/``Connection`` (sync or async, over pysqlite, aiosqlite, psycopg or
psycopg2), inside the transaction the caller already has open. Sync connections get the
plan's result; async ones get an awaitable of it. One plan, every driver: the SQL cannot
drift between them.

Driver exceptions are not translated here: the statements run in the caller's transaction,
and the caller's code already handles its own driver's errors (serialization failures,
deadlocks) and decides whether to retry the whole transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from relay._errors import UnsupportedConnection
from relay._sql import Dialect

T = TypeVar("T")
Row = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Query:
    """One statement (already rendered for the dialect) and its positional parameters."""

    sql: str
    params: Sequence[object]


Plan = Generator[Query, list[Row], T]
"""A writer: yields queries, receives each one's rows, returns its result."""
PlanFactory = Callable[[Dialect], Plan[T]]

_SQLALCHEMY_DRIVERS: dict[str, Dialect] = {
    "pysqlite": "sqlite",
    "aiosqlite": "sqlite",
    "psycopg": "postgresql",
    "psycopg2": "postgresql",
    "psycopg_async": "postgresql",
}


def run(conn: object, plan: PlanFactory[T]) -> T | Awaitable[T]:
    """Drive ``plan`` on ``conn`` in the caller's transaction (awaitable for async connections)."""
    if isinstance(conn, sqlite3.Connection):
        return _run_sync(plan("sqlite"), lambda q: conn.execute(q.sql, tuple(q.params)).fetchall())
    if isinstance(conn, psycopg.Connection):
        return _run_sync(plan("postgresql"), lambda q: _psycopg_rows(conn.execute(q.sql, q.params)))
    if isinstance(conn, psycopg.AsyncConnection):
        return _run_psycopg_async(conn, plan("postgresql"))
    if type(conn).__module__.startswith("sqlalchemy."):
        return _run_sqlalchemy(conn, plan)
    raise UnsupportedConnection(
        f"cannot write the outbox through {type(conn).__module__}.{type(conn).__qualname__}: "
        "pass a sqlite3.Connection, a psycopg (async) Connection, or a SQLAlchemy "
        "(async) Session or Connection"
    )


def _run_sync(plan: Plan[T], execute: Callable[[Query], list[Row]]) -> T:
    rows: list[Row] | None = None
    try:
        while True:
            query = plan.send(rows) if rows is not None else next(plan)
            rows = execute(query)
    except StopIteration as done:
        result: T = done.value
        return result


async def _run_async(plan: Plan[T], execute: Callable[[Query], Awaitable[list[Row]]]) -> T:
    rows: list[Row] | None = None
    try:
        while True:
            query = plan.send(rows) if rows is not None else next(plan)
            rows = await execute(query)
    except StopIteration as done:
        result: T = done.value
        return result


def _psycopg_rows(cursor: psycopg.Cursor[Any]) -> list[Row]:
    return list(cursor.fetchall()) if cursor.description is not None else []


async def _run_psycopg_async(conn: psycopg.AsyncConnection[Any], plan: Plan[T]) -> T:
    async def execute(query: Query) -> list[Row]:
        cursor = await conn.execute(query.sql, query.params)
        return list(await cursor.fetchall()) if cursor.description is not None else []

    return await _run_async(plan, execute)


def _run_sqlalchemy(conn: object, plan: PlanFactory[T]) -> T | Awaitable[T]:
    # Imported here: SQLAlchemy is an optional extra.
    from sqlalchemy.engine import Connection  # noqa: PLC0415
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession  # noqa: PLC0415
    from sqlalchemy.orm import Session  # noqa: PLC0415

    if isinstance(conn, Session | Connection):
        sync = conn.connection() if isinstance(conn, Session) else conn
        dialect = _sqlalchemy_dialect(sync.dialect.name, sync.dialect.driver)
        return _run_sync(
            plan(dialect), lambda q: _sqlalchemy_rows(sync.exec_driver_sql(q.sql, tuple(q.params)))
        )
    if isinstance(conn, AsyncSession | AsyncConnection):

        async def run_async() -> T:
            aconn = await conn.connection() if isinstance(conn, AsyncSession) else conn
            dialect = _sqlalchemy_dialect(aconn.dialect.name, aconn.dialect.driver)

            async def execute(query: Query) -> list[Row]:
                return _sqlalchemy_rows(await aconn.exec_driver_sql(query.sql, tuple(query.params)))

            return await _run_async(plan(dialect), execute)

        return run_async()
    raise UnsupportedConnection(
        f"cannot write the outbox through {type(conn).__qualname__}: pass a SQLAlchemy "
        "Session, AsyncSession, Connection or AsyncConnection"
    )


def _sqlalchemy_dialect(name: str, driver: str) -> Dialect:
    dialect = _SQLALCHEMY_DRIVERS.get(driver)
    if dialect is None or dialect != ("postgresql" if name == "postgresql" else name):
        raise UnsupportedConnection(
            f"SQLAlchemy dialect {name}+{driver} is not supported: use sqlite (pysqlite, aiosqlite) "
            "or postgresql (psycopg, psycopg2)"
        )
    return dialect


def _sqlalchemy_rows(result: Any) -> list[Row]:
    return [tuple(row) for row in result.fetchall()] if result.returns_rows else []


if TYPE_CHECKING:
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

    SyncConnection = sqlite3.Connection | psycopg.Connection[Any] | Session | SAConnection
    """A connection whose writes return their result."""
    AsyncConnection = psycopg.AsyncConnection[Any] | AsyncSession | SAAsyncConnection
    """A connection whose writes return an awaitable of their result."""
