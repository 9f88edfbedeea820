"""The inbox's refusals, and the replies it has nowhere to send (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

import bus
import relay
from tests.relay.conftest import OutboxDb
from tests.relay.helpers import Charged


def command(key: str, *, reply_to: str = "") -> bus.Envelope:
    return bus.new_envelope(Charged(order=key), max_bytes=1 << 20, idempotency_key=key, reply_to=reply_to)


def outbox_rows(outbox_db: OutboxDb) -> int:
    [(count,)] = outbox_db.query("SELECT count(*) FROM {outbox}")
    return int(count)


def test_the_inbox_refuses_misuse_and_sends_nothing_when_nothing_is_asked(outbox_db: OutboxDb) -> None:
    inbox = relay.Inbox(outbox_db.tables, outbox=relay.Outbox(outbox_db.tables, max_payload_bytes=64))
    conn = outbox_db.connect()
    try:
        with pytest.raises(ValueError, match="consumer name must not be empty"):
            inbox.receive(conn, "", command("k0"))

        # no reply_to: the reply is recorded for duplicates, and nothing goes to the outbox
        fresh = inbox.receive(conn, "payments", command("k1"))
        assert fresh.reply(Charged) is None  # nothing recorded yet
        assert inbox.reply(conn, fresh, Charged(order="k1", note="ok")) is None
        duplicate = inbox.receive(conn, "payments", command("k1"))
        assert duplicate.duplicate
        assert duplicate.reply(Charged) == Charged(order="k1", note="ok")
        assert inbox.resend(conn, duplicate) is None
        with pytest.raises(relay.RelayError, match=r"already replied to 'k1': call inbox\.resend\(\)"):
            inbox.reply(conn, duplicate, Charged(order="k1"))

        # a duplicate of a command that was never replied to: nothing to resend
        inbox.receive(conn, "payments", command("k2", reply_to="rs:{orders:0}:inbox"))
        unanswered = inbox.receive(conn, "payments", command("k2", reply_to="rs:{orders:0}:inbox"))
        assert unanswered.duplicate
        assert inbox.resend(conn, unanswered) is None

        big = inbox.receive(conn, "payments", command("k3", reply_to="rs:{orders:0}:inbox"))
        with pytest.raises(bus.PayloadTooLarge):
            inbox.reply(conn, big, Charged(order="k3", note="x" * 100))
        conn.commit()
    finally:
        conn.close()
    assert outbox_rows(outbox_db) == 0
