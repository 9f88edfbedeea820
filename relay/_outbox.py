"""Writing messages to the outbox inside the caller's own transaction."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, overload

import msgspec

from bus import Authenticator, BusConfig, Clock, Envelope, Stream, SystemClock, new_envelope
from bus.lowlevel import stream_audience
from bus.tracing import with_current
from relay._codec import encode_envelope
from relay._config import Tables
from relay._drivers import Plan, PlanFactory, Query, run
from relay._sql import Dialect, statements

if TYPE_CHECKING:
    from relay._drivers import AsyncConnection, SyncConnection

_MAX_PAYLOAD_BYTES = BusConfig().max_payload_bytes


class Outbox:
    """Adds messages to the outbox table through the caller's connection and transaction.

    The row commits or rolls back with the caller's business change; the relay publishes
    committed rows to their streams, each exactly once within its dedupe window. With a
    sync connection (``sqlite3``, psycopg ``Connection``, SQLAlchemy ``Session``) the call
    returns the row id; with an async one (psycopg ``AsyncConnection``, SQLAlchemy
    ``AsyncSession``) it returns an awaitable of it::

        with conn:  # sqlite3: one transaction
            conn.execute("INSERT INTO ledger ...")
            relay.outbox.add(conn, "payments.events", CardCharged(order="o1"), ordering_key="o1")

    Rows with the same ``ordering_key`` are published in commit order (on PostgreSQL, writers
    of one key queue on a transaction-scoped advisory lock; see ``docs/relay.md``).

    Args:
        tables: The table names (as created by ``saga relay init-db``).
        source: The ``source`` context written into every envelope.
        max_payload_bytes: Messages whose payload is larger are refused before anything is
            written (:class:`bus.PayloadTooLarge`).
        clock: Where ``created_at`` comes from.
        auth: Signs each row's envelope as it is written, in the caller's transaction, so
            the relay publishes it as signed by the process that wrote it and needs no key
            of its own (``bus/_auth.py``). Default: what ``REDSAGA_KEYRING`` says when a
            row is written. Without a keyring a write raises :class:`bus.AuthError` unless
            signing was turned off on purpose (``REDSAGA_VERIFY=off``, :data:`bus.SIGNING_OFF`).
        principal: Who rows are signed as (default: this process's participant, service,
            orchestrator or client keyring, in that order of preference).

    """

    def __init__(
        self,
        tables: Tables | None = None,
        *,
        source: str = "",
        max_payload_bytes: int = _MAX_PAYLOAD_BYTES,
        clock: Clock | None = None,
        auth: Authenticator | None = None,
        principal: str | None = None,
    ) -> None:
        self.tables = tables or Tables()
        self.source = source
        self.max_payload_bytes = max_payload_bytes
        self.clock: Clock = clock or SystemClock()
        self._auth = auth
        self._principal = principal

    @property
    def auth(self) -> Authenticator:
        """What signs the rows (the environment's unless one was given)."""
        return Authenticator.from_env() if self._auth is None else self._auth

    def signed(self, stream: Stream, envelope: Envelope, *, audience: str = "", signer: str = "") -> Envelope:
        """``envelope`` as a row for ``stream`` stores it: signed, unless signing is off or it is.

        ``audience`` defaults to the stream's own (``stream:<key>``: domain events);
        ``signer`` to this outbox's principal.
        """
        auth = self.auth
        if not auth.enabled:
            auth.refuse_unsigned("this outbox")  # an unsigned row would be dead-lettered by its readers
        if not auth.enabled or envelope.mac:
            return envelope
        who = signer or self._principal or auth.signer_for("participant", "service", "orchestrator", "client")
        return auth.sign(envelope, audience or stream_audience(stream.key), who)

    def envelope(
        self,
        message: object,
        *,
        correlation_id: str = "",
        causation_id: str = "",
        idempotency_key: str = "",
        reply_to: Stream | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
    ) -> Envelope:
        """Wrap ``message`` as :meth:`add` would (new UUIDv7 id unless ``message_id`` is given)."""
        return new_envelope(
            message,
            max_bytes=self.max_payload_bytes,
            source=self.source,
            correlation_id=correlation_id,
            causation_id=causation_id,
            idempotency_key=idempotency_key,
            reply_to=reply_to.key if reply_to else "",
            headers=headers,
            message_id=message_id,
            now_ms=self.clock.now_ms(),
        )

    @overload
    def add(
        self,
        conn: SyncConnection,
        stream: str | Stream,
        message: object,
        *,
        ordering_key: str | None = None,
        correlation_id: str = "",
        causation_id: str = "",
        idempotency_key: str = "",
        reply_to: Stream | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
    ) -> int: ...

    @overload
    def add(
        self,
        conn: AsyncConnection,
        stream: str | Stream,
        message: object,
        *,
        ordering_key: str | None = None,
        correlation_id: str = "",
        causation_id: str = "",
        idempotency_key: str = "",
        reply_to: Stream | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
    ) -> Awaitable[int]: ...

    def add(
        self,
        conn: SyncConnection | AsyncConnection,
        stream: str | Stream,
        message: object,
        *,
        ordering_key: str | None = None,
        correlation_id: str = "",
        causation_id: str = "",
        idempotency_key: str = "",
        reply_to: Stream | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
    ) -> int | Awaitable[int]:
        """Add ``message`` for ``stream`` in ``conn``'s open transaction; return the row id.

        ``stream`` is a :class:`bus.Stream` or a plain name (``"payments"`` is
        ``Stream.named("payments")``). ``message_id`` fixes the envelope id, which is also
        the publish dedupe key: give a stable one when a retried transaction must not
        produce a second message. Raises :class:`bus.PayloadTooLarge` before writing.
        """
        envelope = self.envelope(
            message,
            correlation_id=correlation_id,
            causation_id=causation_id,
            idempotency_key=idempotency_key,
            reply_to=reply_to,
            headers=headers,
            message_id=message_id,
        )
        return run(conn, self.insert_plan(stream, envelope, ordering_key))

    @overload
    def add_envelope(
        self,
        conn: SyncConnection,
        stream: str | Stream,
        envelope: Envelope,
        *,
        ordering_key: str | None = None,
    ) -> int: ...

    @overload
    def add_envelope(
        self,
        conn: AsyncConnection,
        stream: str | Stream,
        envelope: Envelope,
        *,
        ordering_key: str | None = None,
    ) -> Awaitable[int]: ...

    def add_envelope(
        self,
        conn: SyncConnection | AsyncConnection,
        stream: str | Stream,
        envelope: Envelope,
        *,
        ordering_key: str | None = None,
    ) -> int | Awaitable[int]:
        """Add a ready-made envelope (its id is the publish dedupe key); return the row id."""
        return run(conn, self.insert_plan(stream, envelope, ordering_key))

    def insert_plan(
        self,
        stream: str | Stream,
        envelope: Envelope,
        ordering_key: str | None,
        *,
        audience: str = "",
        signer: str = "",
    ) -> PlanFactory[int]:
        """The statements that add one row (its envelope signed: :meth:`signed`), as a plan.

        An envelope not yet signed that carries no trace context gets the current span's
        (the handler's or request's that adds the row in its transaction), so what consumes
        the row once the relay publishes it joins that trace.
        """
        target = stream if isinstance(stream, Stream) else Stream.named(stream)
        if not envelope.mac:
            headers = with_current(envelope.headers)
            if headers is not envelope.headers:
                envelope = msgspec.structs.replace(envelope, headers=headers)
        envelope = self.signed(target, envelope, audience=audience, signer=signer)
        blob = encode_envelope(envelope)
        tables = self.tables

        def plan(dialect: Dialect) -> Plan[int]:
            sql = statements(tables, dialect)
            values = (envelope.id, target.key, ordering_key, envelope.type, blob, envelope.created_at_ms)
            if ordering_key is not None and dialect == "postgresql":
                rows = yield Query(sql.insert_outbox_keyed, (tables.lock_class, ordering_key, *values))
            else:
                rows = yield Query(sql.insert_outbox, values)
            return int(rows[0][0])

        return plan
