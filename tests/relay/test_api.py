"""The relay package's configuration and its published DDL (its names: tests/test_public_api.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

import relay
from tests.relay.conftest import _drop_pg_tables


@pytest.mark.parametrize(
    "name", ["", "has space", "semi;colon", "quote'", "a" * 49, "1starts_with_digit", "schema.table"]
)
def test_table_names_must_be_plain_identifiers(name: str):
    with pytest.raises(ValueError, match="plain identifier"):
        relay.Tables(outbox=name)


def test_table_names_must_differ():
    with pytest.raises(ValueError, match="must differ"):
        relay.Tables(outbox="same", inbox="same")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("batch_size", 0),
        ("batch_size", 20_000),
        ("poll_interval_s", 0),
        ("dedupe_window_s", -1),
        ("retention_s", -1),
    ],
)
def test_relay_config_is_validated_in_one_place(field: str, value: object):
    with pytest.raises(ValueError, match=f"RelayConfig.{field}"):
        relay.RelayConfig(**{field: value})  # type: ignore[arg-type]


def test_invalid_dsns_are_refused_without_leaking_a_password():
    with pytest.raises(relay.InvalidDsn) as caught:
        relay.Relay.connect("mysql://user:secret@host/db", None)  # type: ignore[arg-type]
    assert "secret" not in str(caught.value)
    assert "postgresql://" in str(caught.value)


def test_the_published_sqlite_ddl_creates_a_working_schema(tmp_path: Path):
    conn = sqlite3.connect(tmp_path / "hand-made.db")
    conn.executescript(relay.ddl("sqlite"))
    conn.close()
    # init-db finds the version row the DDL wrote and has nothing to do.
    from tests.relay.conftest import in_thread

    assert in_thread(relay.init_db, f"sqlite:///{tmp_path / 'hand-made.db'}") == []


def test_the_published_postgres_ddl_creates_a_working_schema(pg_dsn: str):
    tables = relay.Tables.prefixed("ddl_check")
    _drop_pg_tables(pg_dsn, tables)
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(relay.ddl("postgresql", tables))
        from tests.relay.conftest import in_thread

        assert in_thread(relay.init_db, pg_dsn, tables) == []
    finally:
        _drop_pg_tables(pg_dsn, tables)


def test_a_second_relay_on_one_sqlite_file_is_refused(tmp_path: Path):
    from relay._sqlite_store import SqliteStore
    from tests.relay.conftest import in_thread

    dsn = f"sqlite:///{tmp_path / 'one.db'}"
    in_thread(relay.init_db, dsn)
    config = relay.RelayConfig()

    async def open_two() -> None:
        first = SqliteStore(str(tmp_path / "one.db"), config)
        second = SqliteStore(str(tmp_path / "one.db"), config)
        await first.open()
        try:
            with pytest.raises(relay.RelayLocked, match="another relay already serves"):
                await second.open()
        finally:
            await first.close()
        await second.open()  # free again once the first is gone
        await second.close()

    in_thread(open_two)


def test_the_relay_never_prints_to_stdout(sqlite_db, capsys: pytest.CaptureFixture[str]):
    """A library logs through the application's logging, never onto stdout (where a
    command's --json document goes): its info and warning lines included."""
    import bus
    from tests.relay.conftest import in_thread
    from tests.relay.helpers import Charged

    conn = sqlite_db.connect()
    relay.Outbox(sqlite_db.tables).add(conn, "payments", Charged(order="o1"))
    bad = relay.Outbox(sqlite_db.tables).add(conn, "payments", Charged(order="o2"))
    conn.commit()
    conn.close()
    sqlite_db.query("UPDATE {outbox} SET stream = 'not-a-stream-key' WHERE id = ?", (bad,))  # a warning

    async def drain() -> relay.RelayCounters:
        redis = bus.connect(bus.MEMORY_URL)
        worker = relay.Relay.connect(sqlite_db.dsn, redis, config=sqlite_db.config())
        await worker.run(drain=True)
        await redis.aclose()
        return worker.counters

    counters = in_thread(drain)
    assert (counters.sent, counters.failed) == (1, 1)
    assert capsys.readouterr().out == ""
