"""The relay's errors; database driver exceptions are translated here and nowhere else.

::

    RelayError
    ├── DatabaseUnavailable     the database could not be reached or dropped the link (a retry may help)
    ├── DatabaseError           the database rejected a statement (a bug, a permission, a constraint)
    ├── SchemaMissing           the outbox tables are absent or older than this code: run init-db
    ├── UnsupportedConnection   ``add``/``receive`` got a connection type redsaga cannot drive
    ├── InvalidDsn              the ``--dsn`` is neither a libpq connection string nor ``sqlite:///…``
    └── RelayLocked             another relay already serves this SQLite file

Redis errors keep the bus's tree (``bus.RedisUnavailable`` and friends). Every error carries
``retryable`` so the relay loop decides without matching text, and a message of one line
(libpq's own messages span several).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


class RelayError(Exception):
    """Base class of every error the relay package raises."""

    retryable: bool = False


class DatabaseUnavailable(RelayError):
    """The database is unreachable or the connection broke; the open transaction is lost."""

    retryable = True


class DatabaseError(RelayError):
    """The database refused a statement; retrying the same statement will not help."""


class SchemaMissing(RelayError):
    """The outbox/inbox tables are missing or out of date.

    Run ``saga relay init-db --dsn …`` (or apply the DDL from ``docs/relay.md``).
    """


class UnsupportedConnection(RelayError, TypeError):
    """The object passed as a connection is not one redsaga can write through."""


class InvalidDsn(RelayError, ValueError):
    """A DSN redsaga cannot open (its message shows the DSN without its password)."""


class RelayLocked(RelayError):
    """Another relay process holds this SQLite database's relay lock."""

    retryable = True


# SQLSTATE classes that mean "the link or the server went away", not "your SQL is wrong":
# 08 connection exception, 57P01-57P03 admin shutdown / crash shutdown / cannot connect now,
# 53 insufficient resources, 40 transaction rollback (serialization, deadlock: retry helps).
_PG_RETRYABLE_PREFIXES = ("08", "57P", "53", "40")


def translate_pg(error: psycopg.Error) -> RelayError:
    """Map one psycopg exception to the relay's error tree."""
    state = error.sqlstate or ""
    if isinstance(error, psycopg.OperationalError | psycopg.InterfaceError) or state.startswith(
        _PG_RETRYABLE_PREFIXES
    ):
        return DatabaseUnavailable(f"PostgreSQL unavailable: {_one_line(error)}")
    if state == "42P01":  # undefined_table
        return SchemaMissing(f"{_one_line(error)} (run 'saga relay init-db --dsn …')")
    return DatabaseError(f"{type(error).__name__}: {_one_line(error)}")


def _one_line(error: Exception) -> str:
    """The driver's message (libpq's: a line, then indented hints) joined into one line."""
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())


_SQLITE_RETRYABLE = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
    }
)


def translate_sqlite(error: sqlite3.Error) -> RelayError:
    """Map one sqlite3 exception to the relay's error tree (by SQLite's primary result code)."""
    code = getattr(error, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in _SQLITE_RETRYABLE:
        return DatabaseUnavailable(f"SQLite unavailable: {_one_line(error)}")
    # A missing table is a plain SQLITE_ERROR; SQLite says which only in the message.
    if str(error).startswith("no such table"):
        return SchemaMissing(f"{_one_line(error)} (run 'saga relay init-db --dsn …')")
    return DatabaseError(f"{type(error).__name__}: {_one_line(error)}")


@contextmanager
def database_errors() -> Iterator[None]:
    """Translate psycopg and sqlite3 exceptions raised in the block into :class:`RelayError`."""
    try:
        yield
    except psycopg.Error as error:
        raise translate_pg(error) from error
    except sqlite3.Error as error:
        raise translate_sqlite(error) from error
