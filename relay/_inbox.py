"""The inbox: idempotent consumers whose effects live in a database.

A handler records the incoming message's idempotency key in the inbox table in the same
transaction as its business change and its reply (which goes out through the outbox). A
redelivery, or a retried command with the same idempotency key, finds the key already there:
the handler skips the change and re-sends the first reply instead::

    with db:  # one transaction
        received = relay.inbox.receive(db, "payments", delivery.envelope)
        if received.duplicate:
            relay.inbox.resend(db, received)  # the first reply, not a second charge
            return
        db.execute("INSERT INTO ledger ...")
        relay.inbox.reply(db, received, CardCharged(order=command.order))

Two concurrent deliveries of one key cannot both apply: the second insert waits on the
first transaction's primary key and, once it commits, sees the key as a duplicate.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, overload

import msgspec

from bus import Clock, Envelope, PayloadTooLarge, Stream, SystemClock, message_type
from bus.lowlevel import reply_to_command
from relay._config import Tables
from relay._drivers import Plan, PlanFactory, Query, run
from relay._errors import RelayError
from relay._outbox import Outbox
from relay._sql import Dialect, statements

if TYPE_CHECKING:
    from relay._drivers import AsyncConnection, SyncConnection

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Received:
    """What the inbox knows about one incoming message.

    Attributes:
        consumer: The consumer that received it (one inbox serves many handlers).
        message: The envelope as delivered this time.
        duplicate: Whether this key was received before (then skip the business change).
        first_message_id: The message id of the first delivery of this key.
        reply_type: The first reply's message type, if one was recorded.
        reply_payload: The first reply's encoded payload, if one was recorded.

    """

    consumer: str
    message: Envelope
    duplicate: bool
    first_message_id: str
    reply_type: str | None = None
    reply_payload: bytes | None = None

    @property
    def key(self) -> str:
        """The inbox key: the idempotency key, else the message id."""
        return self.message.dedupe_key

    def reply(self, message_class: type[M]) -> M | None:
        """Decode the recorded first reply as ``message_class`` (``None`` if there was none)."""
        if self.reply_type is None or self.reply_payload is None:
            return None
        envelope = Envelope(id=self.first_message_id, type=self.reply_type, payload=self.reply_payload)
        return envelope.decode(message_class)


class Inbox:
    """Records received messages and their first replies in the caller's transaction.

    Replies go to the command's ``reply_to`` stream through ``outbox``, with an id derived
    from the command's id (as the bus does for handler replies), ordered by the command's
    correlation id (the saga id). With signing on, a reply is signed for whoever signed the
    command, as ``participant:<consumer>`` when this process holds that keyring (name the
    consumer after the participant), else as the outbox's principal.
    """

    def __init__(
        self, tables: Tables | None = None, *, outbox: Outbox | None = None, clock: Clock | None = None
    ) -> None:
        self.tables = tables or Tables()
        self.outbox = outbox or Outbox(self.tables)
        self.clock: Clock = clock or SystemClock()

    @overload
    def receive(self, conn: SyncConnection, consumer: str, message: Envelope) -> Received: ...

    @overload
    def receive(self, conn: AsyncConnection, consumer: str, message: Envelope) -> Awaitable[Received]: ...

    def receive(
        self, conn: SyncConnection | AsyncConnection, consumer: str, message: Envelope
    ) -> Received | Awaitable[Received]:
        """Record ``message`` for ``consumer``, or find that it was received before."""
        if not consumer:
            raise ValueError("an inbox consumer name must not be empty")
        tables, now_ms = self.tables, self.clock.now_ms()

        def plan(dialect: Dialect) -> Plan[Received]:
            sql = statements(tables, dialect)
            key = message.dedupe_key
            inserted = yield Query(sql.inbox_insert, (consumer, key, message.id, now_ms))
            if inserted:
                return Received(consumer, message, duplicate=False, first_message_id=message.id)
            rows = yield Query(sql.inbox_select, (consumer, key))
            first_id, reply_type, reply_payload = rows[0]
            return Received(
                consumer,
                message,
                duplicate=True,
                first_message_id=str(first_id),
                reply_type=reply_type,
                reply_payload=bytes(reply_payload) if reply_payload is not None else None,
            )

        return run(conn, plan)

    @overload
    def reply(self, conn: SyncConnection, received: Received, message: object) -> int | None: ...

    @overload
    def reply(self, conn: AsyncConnection, received: Received, message: object) -> Awaitable[int | None]: ...

    def reply(
        self, conn: SyncConnection | AsyncConnection, received: Received, message: object
    ) -> int | Awaitable[int | None] | None:
        """Record ``message`` as the first reply and add it to the outbox; return its row id.

        Returns ``None`` (nothing to send) when the command names no ``reply_to`` stream.
        """
        if received.duplicate:
            raise RelayError(
                f"{received.consumer} already replied to {received.key!r}: "
                "call inbox.resend() for a duplicate, not inbox.reply()"
            )
        payload = msgspec.json.encode(message)
        if len(payload) > self.outbox.max_payload_bytes:
            raise PayloadTooLarge(len(payload), self.outbox.max_payload_bytes)
        return run(conn, self._reply_plan(received, message_type(type(message)), payload, record=True))

    @overload
    def resend(self, conn: SyncConnection, received: Received) -> int | None: ...

    @overload
    def resend(self, conn: AsyncConnection, received: Received) -> Awaitable[int | None]: ...

    def resend(
        self, conn: SyncConnection | AsyncConnection, received: Received
    ) -> int | Awaitable[int | None] | None:
        """Add the first reply again, addressed to this delivery; return its row id.

        Its id derives from this delivery's message id: a redelivery of the same entry is
        deduped by the relay, a retried command (new id, same idempotency key) gets the
        reply again. Returns ``None`` when no reply was recorded or none is asked for.
        """
        if received.reply_type is None or received.reply_payload is None:
            return _nothing(conn)
        return run(
            conn, self._reply_plan(received, received.reply_type, received.reply_payload, record=False)
        )

    def _reply_plan(
        self, received: Received, type_name: str, payload: bytes, *, record: bool
    ) -> PlanFactory[int | None]:
        tables = self.tables
        command = received.message
        envelope = reply_to_command(
            command, type_name, payload, source=self.outbox.source, now_ms=self.clock.now_ms()
        )
        auth = self.outbox.auth
        participant = f"participant:{received.consumer}"
        insert = (
            self.outbox.insert_plan(
                Stream.from_key(command.reply_to),
                envelope,
                command.correlation_id or None,
                audience=command.signer,  # the reply goes to whoever signed the command
                signer=participant if participant in auth.keyrings else "",
            )
            if command.reply_to
            else None
        )

        def plan(dialect: Dialect) -> Plan[int | None]:
            if record:
                sql = statements(tables, dialect)
                yield Query(sql.inbox_set_reply, (type_name, payload, received.consumer, received.key))
            if insert is None:
                return None
            return (yield from insert(dialect))

        return plan


def _nothing(conn: object) -> int | Awaitable[int | None] | None:
    def plan(_dialect: Dialect) -> Plan[int | None]:
        return None
        yield  # a generator with no queries

    return run(conn, plan)
