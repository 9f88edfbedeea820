"""Every SQL statement the relay package runs, for PostgreSQL and SQLite, in one place.

Statements are written once with ``?`` placeholders and rendered per dialect: SQLite's
``sqlite3`` takes them as they are, psycopg (and SQLAlchemy over psycopg) gets ``%s``.
Table names come from :class:`~relay.Tables`, which only admits plain identifiers.

Row states in ``<outbox>.status``: 0 pending, 1 sent, 2 failed.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from functools import cache
from typing import Final, Literal

from relay._config import Tables

Dialect = Literal["postgresql", "sqlite"]
PENDING: Final = 0
SENT: Final = 1
FAILED: Final = 2

_OUTBOX_COLUMNS = "message_id, stream, ordering_key, type, envelope, created_at_ms"


def render(sql: str, dialect: Dialect) -> str:
    """Render ``?`` placeholders for ``dialect`` (``%s``, with literal ``%`` doubled, for psycopg)."""
    if dialect == "sqlite":
        return sql
    return sql.replace("%", "%%").replace("?", "%s")


@dataclass(frozen=True, slots=True)
class Statements:
    """The statements of one set of tables in one dialect (see :func:`statements`)."""

    insert_outbox: str
    insert_outbox_keyed: str
    inbox_insert: str
    inbox_select: str
    inbox_set_reply: str
    claim: str
    mark_sent: str
    mark_failed: str
    schema_version: str
    pending_exists: str
    stats: str
    failed_count: str
    list_failed: str
    requeue: str
    purge_sent: str
    archive_sent: str
    purge_inbox: str


@cache
def statements(tables: Tables, dialect: Dialect) -> Statements:
    """Build (once) every statement for ``tables`` in ``dialect``."""
    t = tables
    insert = f"INSERT INTO {t.outbox} ({_OUTBOX_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) RETURNING id"
    if dialect == "postgresql":
        # Same-key writers queue on a transaction-scoped advisory lock taken before the row
        # gets its id, so ids of one ordering key are handed out in commit order
        # (docs/relay.md, "Ordering"). The lock is released by COMMIT or ROLLBACK.
        keyed = (
            f"WITH l AS (SELECT pg_advisory_xact_lock(?::int4, hashtext(?::text))) "
            f"INSERT INTO {t.outbox} ({_OUTBOX_COLUMNS}) "
            f"SELECT ?::text, ?::text, ?::text, ?::text, ?::bytea, ?::bigint FROM l RETURNING id"
        )
        # Claim pending rows in id order, skipping rows another relay holds. A row whose
        # ordering key has an earlier pending row outside this batch (held by another relay)
        # is returned flagged ``held_back`` and not published: it would overtake its
        # predecessor. Its lock is released with the batch's transaction.
        claim = (
            f"WITH batch AS ("
            f" SELECT id, message_id, stream, ordering_key, envelope FROM {t.outbox}"
            f" WHERE status = {PENDING} ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED)"
            f" SELECT b.id, b.message_id, b.stream, b.ordering_key, b.envelope,"
            f" b.ordering_key IS NOT NULL AND EXISTS ("
            f"  SELECT 1 FROM {t.outbox} o WHERE o.status = {PENDING} AND o.ordering_key = b.ordering_key"
            f"  AND o.id < b.id AND o.id NOT IN (SELECT id FROM batch)) AS held_back"
            f" FROM batch b"
            f" ORDER BY b.id"
        )
        # One statement marks a whole batch: ids and entry ids (or reasons) as two arrays.
        mark_sent = (
            f"UPDATE {t.outbox} AS o SET status = {SENT}, sent_at_ms = ?, entry_id = u.entry_id "
            f"FROM unnest(?::bigint[], ?::text[]) AS u(id, entry_id) WHERE o.id = u.id"
        )
        mark_failed = (
            f"UPDATE {t.outbox} AS o SET status = {FAILED}, sent_at_ms = ?, error = u.error "
            f"FROM unnest(?::bigint[], ?::text[]) AS u(id, error) WHERE o.id = u.id"
        )
        purge_inbox = (
            f"DELETE FROM {t.inbox} WHERE ctid IN "
            f"(SELECT ctid FROM {t.inbox} WHERE received_at_ms < ? LIMIT ?)"
        )
        archive = (
            f"WITH moved AS (DELETE FROM {t.outbox} WHERE id IN "
            f"(SELECT id FROM {t.outbox} WHERE status = {SENT} AND sent_at_ms < ? ORDER BY id LIMIT ?) "
            f"RETURNING *) INSERT INTO {t.archive} SELECT * FROM moved"
        )
    else:
        keyed = insert  # SQLite has one writer at a time: ids are handed out in commit order.
        claim = (
            f"SELECT id, message_id, stream, ordering_key, envelope, 0 FROM {t.outbox} "
            f"WHERE status = {PENDING} ORDER BY id LIMIT ?"
        )
        # Run with executemany, one parameter tuple per row.
        mark_sent = f"UPDATE {t.outbox} SET status = {SENT}, sent_at_ms = ?, entry_id = ? WHERE id = ?"
        mark_failed = f"UPDATE {t.outbox} SET status = {FAILED}, sent_at_ms = ?, error = ? WHERE id = ?"
        purge_inbox = (
            f"DELETE FROM {t.inbox} WHERE rowid IN "
            f"(SELECT rowid FROM {t.inbox} WHERE received_at_ms < ? LIMIT ?)"
        )
        archive = (
            f"INSERT INTO {t.archive} SELECT * FROM {t.outbox} WHERE id IN "
            f"(SELECT id FROM {t.outbox} WHERE status = {SENT} AND sent_at_ms < ? ORDER BY id LIMIT ?)"
        )
    sql = Statements(
        insert_outbox=insert,
        insert_outbox_keyed=keyed,
        inbox_insert=(
            f"INSERT INTO {t.inbox} (consumer, message_key, message_id, received_at_ms) "
            f"VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING 1"
        ),
        inbox_select=(
            f"SELECT message_id, reply_type, reply_payload FROM {t.inbox} "
            f"WHERE consumer = ? AND message_key = ?"
        ),
        inbox_set_reply=(
            f"UPDATE {t.inbox} SET reply_type = ?, reply_payload = ? WHERE consumer = ? AND message_key = ?"
        ),
        claim=claim,
        mark_sent=mark_sent,
        mark_failed=mark_failed,
        schema_version=f"SELECT max(version) FROM {t.versions}",
        pending_exists=f"SELECT EXISTS (SELECT 1 FROM {t.outbox} WHERE status = {PENDING})",
        stats=f"SELECT count(*), min(created_at_ms) FROM {t.outbox} WHERE status = {PENDING}",
        failed_count=f"SELECT count(*) FROM {t.outbox} WHERE status = {FAILED}",
        list_failed=(
            f"SELECT id, message_id, stream, type, error, sent_at_ms FROM {t.outbox} "
            f"WHERE status = {FAILED} ORDER BY id LIMIT ?"
        ),
        requeue=(
            f"UPDATE {t.outbox} SET status = {PENDING}, error = NULL, sent_at_ms = NULL"
            f" WHERE status = {FAILED} AND id = ?"
        ),
        purge_sent=(
            f"DELETE FROM {t.outbox} WHERE id IN "
            f"(SELECT id FROM {t.outbox} WHERE status = {SENT} AND sent_at_ms < ? ORDER BY id LIMIT ?)"
        ),
        archive_sent=archive,
        purge_inbox=purge_inbox,
    )
    return Statements(*(render(text, dialect) for text in astuple(sql)))
