"""redsaga's transactional outbox and inbox (SQLite and PostgreSQL), and the relay process.

Write a message in the same transaction as the business change::

    with db:
        db.execute("INSERT INTO ledger ...")
        relay.outbox.add(db, "payments.events", CardCharged(order="o1"), ordering_key="o1")

and run ``saga relay --dsn … --redis-url …`` (or :class:`Relay`) to publish committed rows to
their streams, each exactly once within the dedupe window. Consumers with a database use
:data:`inbox` to apply each message once and re-send their first reply on redelivery.
``outbox`` and ``inbox`` use the default table names; build :class:`Outbox` and :class:`Inbox`
with :class:`Tables` for others. See ``docs/relay.md``.

Errors::

    RelayError
    ├── DatabaseUnavailable     the database is unreachable (a retry may help)
    ├── DatabaseError           the database rejected a statement
    ├── SchemaMissing           tables missing or old: run ``saga relay init-db``
    ├── UnsupportedConnection   not a connection the outbox can write through
    ├── InvalidDsn              neither a libpq DSN (``postgresql://…``, ``host=…``) nor ``sqlite:///…``
    └── RelayLocked             another relay serves this SQLite file
"""

from relay._config import RelayConfig, Tables
from relay._dsn import failed_rows, init_db, outbox_stats, parse_dsn, redact, requeue_failed
from relay._errors import (
    DatabaseError,
    DatabaseUnavailable,
    InvalidDsn,
    RelayError,
    RelayLocked,
    SchemaMissing,
    UnsupportedConnection,
)
from relay._inbox import Inbox, Received
from relay._outbox import Outbox
from relay._relay import Relay, RelayCounters, Round
from relay._schema import ddl, latest_version
from relay._store import Claimed, FailedRow, OutboxStats, RelayStore

outbox = Outbox()
"""The outbox with the default table names: ``relay.outbox.add(conn, stream, message)``."""

inbox = Inbox(outbox=outbox)
"""The inbox with the default table names: ``relay.inbox.receive(conn, consumer, envelope)``."""

__all__ = [
    "Claimed",
    "DatabaseError",
    "DatabaseUnavailable",
    "FailedRow",
    "Inbox",
    "InvalidDsn",
    "Outbox",
    "OutboxStats",
    "Received",
    "Relay",
    "RelayConfig",
    "RelayCounters",
    "RelayError",
    "RelayLocked",
    "RelayStore",
    "Round",
    "SchemaMissing",
    "Tables",
    "UnsupportedConnection",
    "ddl",
    "failed_rows",
    "inbox",
    "init_db",
    "latest_version",
    "outbox",
    "outbox_stats",
    "parse_dsn",
    "redact",
    "requeue_failed",
]
