"""DSNs: what each form names (libpq URIs and keywords, SQLite files), and passwords never shown."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from psycopg import conninfo

import relay
from relay._dsn import parse_dsn
from tests.relay.conftest import OutboxDb, _drop_pg_tables, in_thread
from tests.relay.helpers import Charged

SECRET = "s3cret-Pw_9"


@pytest.mark.parametrize(
    ("dsn", "dialect", "where"),
    [
        ("sqlite:///outbox.db", "sqlite", "outbox.db"),
        ("sqlite:////var/lib/app/outbox.db", "sqlite", "/var/lib/app/outbox.db"),
        ("postgresql://app@db:5432/payments", "postgresql", "postgresql://app@db:5432/payments"),
        (
            "postgres://app@db/payments?sslmode=require",
            "postgresql",
            "postgres://app@db/payments?sslmode=require",
        ),
        ("host=db dbname=payments", "postgresql", "host=db dbname=payments"),
        ("host=db port=5433 dbname=payments user=app password='a b'", "postgresql", None),
    ],
)
def test_each_form_names_its_database(dsn: str, dialect: str, where: str | None) -> None:
    target = parse_dsn(dsn)
    assert target.dialect == dialect
    assert target.where == (where or dsn)


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        (
            "mysql://app:" + SECRET + "@db/payments",
            "cannot open 'mysql://app:***@db/payments': mysql: is not supported",
        ),
        ("sqlite://outbox.db", "a SQLite DSN names a file"),
        ("sqlite:///", "a SQLite DSN names a file"),
        ("payments.db", 'missing "=" after "payments.db"'),
        ("host=db colour=blue", 'invalid connection option "colour"'),
        (f"host=db password={SECRET} junk", "'host=db password=*** junk': not a libpq connection string"),
        ("", "the DSN is empty"),
    ],
)
def test_a_dsn_that_names_nothing_is_refused_with_its_password_hidden(dsn: str, message: str) -> None:
    with pytest.raises(relay.InvalidDsn) as refused:
        parse_dsn(dsn)
    assert message in str(refused.value)
    assert SECRET not in str(refused.value)
    assert "use postgresql://user@host:port/db, libpq keywords" in str(refused.value)


# Passwords as people choose them: punctuation, quotes, spaces, "@", "&", "=", non-ASCII.
passwords = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=8, max_size=24)
_REST = (
    "postgresql://app@db:5432/payments?sslmode=require&password= host=db user=app password='' dbname=payments"
)
"""Every other character of the spellings below: a password found in it proves nothing."""


@given(password=passwords)
def test_redact_hides_the_password_in_every_spelling(password: str) -> None:
    assume(password.strip() == password and password not in _REST)
    quoted = password.replace("\\", "\\\\").replace("'", "\\'")
    spellings = [
        f"postgresql://app:{quote(password, safe='')}@db:5432/payments",
        f"postgresql://app@db/payments?password={quote(password, safe='')}&sslmode=require",
        f"host=db user=app password='{quoted}' dbname=payments",
    ]
    for dsn in spellings:
        assert conninfo.conninfo_to_dict(dsn)["password"] == password  # a valid spelling
        hidden = relay.redact(dsn)
        assert password not in hidden
        assert quote(password, safe="") not in hidden
        assert conninfo.conninfo_to_dict(hidden) == {
            **conninfo.conninfo_to_dict(dsn),
            "password": "***",
        }  # the rest is shown as given


def test_redact_leaves_a_dsn_without_a_password_alone() -> None:
    for dsn in ("postgresql://app@db/payments", "host=db dbname=payments", "sqlite:///outbox.db"):
        assert relay.redact(dsn) == dsn


@pytest.mark.anyio
async def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    for dsn in (
        f"postgresql://app:{SECRET}@127.0.0.1:1/payments",
        f"host=127.0.0.1 port=1 password={SECRET}",
    ):
        with pytest.raises(relay.DatabaseUnavailable) as down:
            await relay.outbox_stats(dsn)
        assert SECRET not in str(down.value)
        assert "\n" not in str(down.value)
        assert "Connection refused" in str(down.value)


@pytest.mark.postgres
def test_a_keyword_dsn_opens_postgresql(pg_dsn: str) -> None:
    """docs/relay.md promises any libpq DSN: keywords as well as a URI."""
    keywords = conninfo.make_conninfo("", **conninfo.conninfo_to_dict(pg_dsn))
    assert "://" not in keywords
    tables = relay.Tables.prefixed(f"t{uuid.uuid4().hex[:10]}")
    try:
        assert in_thread(relay.init_db, keywords, tables) == [relay.latest_version()]
        with psycopg.connect(keywords) as conn:
            relay.Outbox(tables).add(conn, "payments", Charged(order="o1"))
        stats = in_thread(_stats, keywords, tables)
        assert (stats.backlog, stats.failed) == (1, 0)
    finally:
        _drop_pg_tables(pg_dsn, tables)


async def _stats(dsn: str, tables: relay.Tables) -> relay.OutboxStats:
    return await relay.outbox_stats(dsn, tables=tables)


@pytest.mark.anyio
async def test_failed_rows_are_listed_and_requeued_without_a_redis(outbox_db: OutboxDb) -> None:
    conn = outbox_db.connect()
    first = relay.Outbox(outbox_db.tables).add(conn, "payments", Charged(order="o1"))
    relay.Outbox(outbox_db.tables).add(conn, "payments", Charged(order="o2"))
    conn.commit()
    conn.close()
    outbox_db.query("UPDATE {outbox} SET status = 2, error = 'NOPERM' WHERE id = ?", (first,))

    [failed] = await relay.failed_rows(outbox_db.dsn, tables=outbox_db.tables)
    assert (failed.id, failed.error) == (first, "NOPERM")
    assert await relay.requeue_failed(outbox_db.dsn, tables=outbox_db.tables) == 1
    assert await relay.failed_rows(outbox_db.dsn, tables=outbox_db.tables) == []
    assert outbox_db.query("SELECT count(*) FROM {outbox} WHERE status = 0") == [(2,)]
