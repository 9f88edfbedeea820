"""Driver errors become the relay's typed errors: retryable, schema missing, or a plain error."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

import relay
from relay._errors import database_errors


def test_sqlite_errors_are_classified(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    holder.execute("INSERT INTO t VALUES ('a')")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(relay.SchemaMissing, match=r"no such table: nope.*saga relay init-db"):
            with database_errors():
                other.execute("SELECT * FROM nope")
        with pytest.raises(relay.DatabaseError, match="IntegrityError: UNIQUE") as plain:
            with database_errors():
                other.execute("INSERT INTO t VALUES ('a')")
        assert not plain.value.retryable
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(relay.DatabaseUnavailable, match="SQLite unavailable: database is locked") as busy:
            with database_errors():
                other.execute("SELECT * FROM t")
        assert busy.value.retryable
    finally:
        other.close()
        holder.close()


@pytest.mark.postgres
def test_postgres_errors_are_classified(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with pytest.raises(relay.SchemaMissing, match=r"(?s)never_created_table.*saga relay init-db"):
            with database_errors():
                conn.execute("SELECT * FROM never_created_table")
        with pytest.raises(relay.DatabaseError, match="DivisionByZero") as plain:
            with database_errors():
                conn.execute("SELECT 1 / 0")
        assert not plain.value.retryable
    with pytest.raises(relay.DatabaseUnavailable, match="PostgreSQL unavailable") as down:
        with database_errors():
            psycopg.connect("postgresql://postgres@127.0.0.1:1/test", connect_timeout=2)
    assert down.value.retryable
