"""outbox.add and the inbox through every supported connection type, in the caller's transaction."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import bus
import relay
from tests.relay.conftest import OutboxDb
from tests.relay.helpers import Charged

pytestmark = pytest.mark.anyio


def _envelope_ids(db: OutboxDb) -> list[str]:
    return [row[0] for row in db.query("SELECT message_id FROM {outbox} ORDER BY id")]


def test_sqlite3_connection(sqlite_db: OutboxDb):
    outbox = relay.Outbox(sqlite_db.tables)
    conn = sqlite3.connect(sqlite_db.dsn.removeprefix("sqlite:///"))
    with pytest.raises(RuntimeError), conn:
        outbox.add(conn, "payments", Charged(order="rolled-back"), message_id="m-rb")
        raise RuntimeError
    with conn:
        outbox.add(conn, "payments", Charged(order="kept"), message_id="m-1", ordering_key="k")
    conn.close()
    assert _envelope_ids(sqlite_db) == ["m-1"]


def test_psycopg_sync_connection(postgres_db: OutboxDb):
    outbox = relay.Outbox(postgres_db.tables)
    with psycopg.connect(postgres_db.dsn) as conn:
        with pytest.raises(RuntimeError), conn.transaction():
            outbox.add(conn, "payments", Charged(order="rolled-back"), message_id="m-rb")
            raise RuntimeError
        with conn.transaction():
            outbox.add(conn, "payments", Charged(order="kept"), message_id="m-1", ordering_key="k")
    assert _envelope_ids(postgres_db) == ["m-1"]


async def test_psycopg_async_connection(postgres_db: OutboxDb):
    outbox = relay.Outbox(postgres_db.tables)
    async with await psycopg.AsyncConnection.connect(postgres_db.dsn) as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await outbox.add(conn, "payments", Charged(order="rolled-back"), message_id="m-rb")
                raise RuntimeError
        async with conn.transaction():
            row_id = await outbox.add(
                conn, "payments", Charged(order="kept"), message_id="m-1", ordering_key="k"
            )
            received = await relay.Inbox(postgres_db.tables).receive(conn, "c", _command())
    assert isinstance(row_id, int)
    assert received.duplicate is False
    assert _envelope_ids(postgres_db) == ["m-1"]


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_sqlalchemy_session(dialect: str, request: pytest.FixtureRequest):
    db: OutboxDb = request.getfixturevalue("sqlite_db" if dialect == "sqlite" else "postgres_db")
    url = db.dsn if dialect == "sqlite" else db.dsn.replace("postgresql://", "postgresql+psycopg://")
    engine = create_engine(url)
    outbox = relay.Outbox(db.tables)
    try:
        with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
            session.execute(text("SELECT 1"))
            outbox.add(session, "payments", Charged(order="rolled-back"), message_id="m-rb")
            raise RuntimeError
        with Session(engine) as session, session.begin():
            outbox.add(session, "payments", Charged(order="kept"), message_id="m-1", ordering_key="k")
            inbox = relay.Inbox(db.tables)
            received = inbox.receive(session, "c", _command())
            assert inbox.reply(session, received, Charged(order="r")) is not None
        with engine.begin() as connection:  # a plain SQLAlchemy Connection works too
            outbox.add(connection, "payments", Charged(order="conn"), message_id="m-2")
    finally:
        engine.dispose()
    assert _envelope_ids(db)[0::2] == ["m-1", "m-2"]  # the reply sits between them


async def test_sqlalchemy_async_session(postgres_db: OutboxDb):
    engine = create_async_engine(postgres_db.dsn.replace("postgresql://", "postgresql+psycopg://"))
    outbox = relay.Outbox(postgres_db.tables)
    try:
        with pytest.raises(RuntimeError):
            async with AsyncSession(engine) as session, session.begin():
                await outbox.add(session, "payments", Charged(order="rolled-back"), message_id="m-rb")
                raise RuntimeError
        async with AsyncSession(engine) as session, session.begin():
            await outbox.add(session, "payments", Charged(order="kept"), message_id="m-1", ordering_key="k")
            received = await relay.Inbox(postgres_db.tables).receive(session, "c", _command())
            assert received.duplicate is False
        async with engine.begin() as connection:
            await outbox.add(connection, "payments", Charged(order="conn"), message_id="m-2")
    finally:
        await engine.dispose()
    assert _envelope_ids(postgres_db) == ["m-1", "m-2"]


def test_an_unsupported_connection_is_refused_with_the_supported_list():
    with pytest.raises(relay.UnsupportedConnection, match=r"sqlite3\.Connection, a psycopg"):
        relay.outbox.add(object(), "payments", Charged(order="x"))  # type: ignore[call-overload]


def test_an_oversized_message_is_refused_before_anything_is_written(sqlite_db: OutboxDb):
    outbox = relay.Outbox(sqlite_db.tables, max_payload_bytes=100)
    with (
        sqlite3.connect(sqlite_db.dsn.removeprefix("sqlite:///")) as conn,
        pytest.raises(bus.PayloadTooLarge),
    ):
        outbox.add(conn, "payments", Charged(order="x" * 200))
    assert _envelope_ids(sqlite_db) == []


def _command() -> bus.Envelope:
    return bus.new_envelope(
        Charged(order="cmd"),
        max_bytes=1 << 20,
        idempotency_key="k1",
        reply_to=bus.Stream.named("replies").key,
    )
