"""What comes into one consumer group: entries read from Redis, each admitted or refused.

:class:`Intake` reads new entries (``XREADGROUP >``, the lean raw path on real Redis; an
idempotent group reads them and claims their idempotency keys in one function,
``lua/read_claim.lua``, behind a wake-up in the same write) and takes over expired ones
(``XAUTOCLAIM``, with each entry's delivery count), and turns every entry into a
:class:`~bus._delivery.Delivery` with its route and decoded message -- or into a
:class:`Refused` that says why it cannot be handled (deleted, malformed, unauthenticated,
over the delivery limit, no handler, a bad ``reply_to``). It changes nothing in Redis but
for the dead letter of an entry deleted while pending and the dedupe claims (at read, or
for the entries read without one); the consumer (``bus/_consumer.py``) acts on what it
returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import ResponseError

from bus._app import Route, Subscription
from bus._connection import is_lean, send_batch
from bus._delivery import Delivery
from bus._envelope import Envelope, Fields, decode_fields
from bus._errors import BusError, MalformedEntry, Unauthenticated, redis_errors
from bus._log import Logger
from bus._lua import PUBLISH, READ_CLAIM
from bus._outcomes import dedupe_claim_call, reply_key_stream
from bus._scripts import Call, CommandCall, run_batch
from redsaga.ids import derived_id
from redsaga.streams import Stream

if TYPE_CHECKING:
    from bus._consumer import Runtime

Entry = tuple[str, Fields | None, int]
"""(entry id, fields or ``None`` if deleted, delivery count)."""
Claim = tuple[bytes | None, bytes]
"""What a read made of an entry's idempotency key (``lua/read_claim.lua``): the claim's
verdict (``None``: claimed, else ``lua/dedupe_claim.lua``'s, or :data:`NO_CLAIM`) and the key
(bytes: as the entry holds it, which may not even be UTF-8)."""
NO_CLAIM: Final = b"N"
"""A read's verdict for an entry whose envelope its script could not parse: nothing claimed."""
ENTRY_LOST = "entry_lost"
UNAUTHENTICATED = "unauthenticated"


@dataclass(frozen=True, slots=True)
class Refused:
    """An entry that cannot be handled, and what to do with it.

    ``dead``: dead-letter it with ``reason`` (and its ``envelope`` when it was decoded);
    otherwise acknowledge and skip it (a type the subscription ignores). ``dedupe_key``: the
    idempotency key whose in-flight marker its read left, cleared as the entry ends.
    """

    reason: str
    envelope: Envelope | None = None
    dead: bool = True
    dedupe_key: bytes | None = None


Admitted = tuple[Delivery, Route, Any]
"""An entry ready to run: its delivery, its route and its decoded message."""


class Intake:
    """Reads the entries of one :class:`~bus._app.Subscription` and admits or refuses each."""

    def __init__(self, runtime: Runtime, subscription: Subscription, log: Logger) -> None:
        self.rt = runtime
        self.sub = subscription
        self.log = log
        self._after: str | None = None  # the id the next wake-up waits after (None: no wake-up)

    async def read_new(self, count: int, block_ms: int | None) -> list[Entry]:
        """XREADGROUP ``>``: the lean path on real Redis (raw reply, one read per loop turn)."""
        redis, stream = self.rt.redis, self.sub.stream
        if not is_lean(redis):
            reply: Any = await redis.xreadgroup(
                self.sub.group, self.rt.consumer, {stream.key: ">"}, count=count, block=block_ms
            )
            return [(i.decode(), f, 1) for _, batch in reply or () for i, f in batch]
        block = () if block_ms is None else ("BLOCK", block_ms)
        command = ("XREADGROUP", "GROUP", self.sub.group, self.rt.consumer, "COUNT", count, *block)
        [raw] = await send_batch(redis, [(*command, "STREAMS", stream.key, ">")], parse=False)
        if isinstance(raw, ResponseError):
            raise raw
        return [
            (i.decode(), None if f is None else dict(zip(f[::2], f[1::2], strict=True)), 1)
            for _, batch in raw or ()
            for i, f in batch
        ]

    async def read_claimed(self, count: int, block_ms: int | None) -> tuple[list[Entry], dict[str, Claim]]:
        """Read new entries and claim their idempotency keys in one call (``lua/read_claim.lua``).

        That call does not block: a wake-up that consumes nothing (``XREAD BLOCK … STREAMS
        <stream> <after>``, ``after`` from the call before) goes ahead of it in the same
        write, and Redis runs it as soon as the wake-up returns: entries and claims in one
        round trip. No wake-up when the read does not block, before the first read, after a
        failed one, or after one that filled its batch (more are likely waiting). On
        fakeredis and a cluster the two go one after the other.
        """
        redis, stream, config = self.rt.redis, self.sub.stream, self.rt.config
        read = READ_CLAIM.call(
            (stream.key, *stream.dedupe_keys(self.sub.group)),
            (self.sub.group, self.rt.consumer, count, config.lease_ms, config.dedupe_quota),
        )
        after, self._after = self._after, None
        calls: list[Call] = [read]
        woken: list[Any] = []
        if block_ms is not None and after is not None:
            wake = CommandCall(("XREAD", "BLOCK", block_ms, "COUNT", 1, "STREAMS", stream.key, after))
            if is_lean(redis):
                calls.insert(0, wake)
            else:
                try:
                    woken.append(await wake.run(redis))
                except BusError as error:
                    woken.append(error)
        *first, reply = await run_batch(redis, calls)
        woken += first
        if isinstance(reply, BusError):
            raise reply
        last, rows = reply
        if not rows and woken and isinstance(woken[0], BusError):
            raise woken[0]  # a wake-up refused at once (an ACL) would make every read spin
        self._after = None if len(rows) >= count else last.decode()
        entries: list[Entry] = []
        claims: dict[str, Claim] = {}
        for raw_id, fields, verdict, key in rows:
            entry_id = raw_id.decode()
            entries.append((entry_id, dict(zip(fields[::2], fields[1::2], strict=True)), 1))
            claims[entry_id] = (verdict, key)
        return entries, claims

    async def claim_expired(
        self, cursor: str, count: int, *, among: int
    ) -> tuple[str, list[Entry], list[str]]:
        """XAUTOCLAIM from ``cursor``: the next cursor, the entries taken over, the ids deleted.

        ``among`` is how many other entries this consumer holds (see :meth:`delivery_counts`).
        """
        with redis_errors():
            next_cursor, claimed, deleted = await self.rt.redis.xautoclaim(
                self.sub.stream.key,
                self.sub.group,
                self.rt.consumer,
                self.rt.config.lease_ms,
                cursor,
                count=count,
            )
        counts = await self.delivery_counts([i.decode() for i, _ in claimed], among=among)
        entries = [(i.decode(), f, counts.get(i.decode(), 1)) for i, f in claimed]
        return next_cursor.decode(), entries, [i.decode() for i in deleted]

    async def delivery_counts(self, entry_ids: list[str], *, among: int = 0) -> dict[str, int]:
        """How often each of ``entry_ids`` (ascending) was delivered; those no longer pending are absent.

        ``among``: how many other entries this consumer holds, which may lie between them.
        """
        if not entry_ids:
            return {}
        with redis_errors():
            rows: Any = await self.rt.redis.xpending_range(
                self.sub.stream.key,
                self.sub.group,
                min=entry_ids[0],
                max=entry_ids[-1],
                count=len(entry_ids) + among,
                consumername=self.rt.consumer,
            )
        return {row["message_id"].decode(): int(row["times_delivered"]) for row in rows}

    async def report_lost(self, entry_id: str) -> None:
        """Record an entry that was deleted or trimmed while pending (it cannot be handled)."""
        self.log.error(
            "pending entry was deleted or trimmed before it was handled", entry=entry_id, incident=ENTRY_LOST
        )
        self.rt.incidents[ENTRY_LOST] += 1
        stream = self.sub.stream
        dlq = Stream(stream.tag, "dlq")
        # Written with the publish script so that a re-sent report adds one letter only; its
        # window is this group's own (a participant's user may write the letter, not read it).
        fields: list[str | bytes | int | float] = [
            dlq.key,
            derived_id(f"{stream.key}/{entry_id}", "lost"),
            self.rt.config.publish_dedupe_window_ms,
            "stream",
            stream.key,
            "entry",
            entry_id,
            "group",
            self.sub.group,
            "consumer",
            self.rt.consumer,
            "reason",
            "entry was deleted or trimmed while pending",
            "raw_missing",
            1,
            "last_failed_ms",
            self.rt.clock.now_ms(),
        ]
        await PUBLISH(self.rt.redis, [stream.lost_key(self.sub.group)], fields)

    async def verdicts(self, ready: list[Admitted], claims: dict[str, Claim]) -> dict[str, bytes | None]:
        """The dedupe claim's verdict of each entry in ``ready`` (``None``: run its handler).

        Made as the entry was read (``claims``), else claimed now: the claim rides in the
        completer's next pipeline (with other streams' claims and completions) instead of a
        round trip of its own; a failure is not retried there but raised here.
        """
        deduped = [d for d, _, _ in ready if d.dedupe_key and d.entry_id not in claims]
        verdicts = {entry_id: verdict for entry_id, (verdict, _) in claims.items()}
        if deduped:
            claimed = await self.rt.completer.call(dedupe_claim_call(deduped, self.rt.config), retry=False)
            verdicts.update(zip((d.entry_id for d in deduped), claimed, strict=True))
        return verdicts

    def admit(
        self,
        entry_id: str,
        fields: Fields | None,
        deliveries: int,
        beat: Callable[[Delivery], Awaitable[bool]],
        claim: Claim | None = None,
    ) -> Admitted | Refused:
        """Decode an entry and pick its route, or say why it cannot be handled.

        ``beat`` extends the delivery's lease (``Delivery.heartbeat``). ``claim``: what its
        read made of its idempotency key (:meth:`read_claimed`); a refusal then names the
        key it claimed, whose marker its end clears, and a key other than the envelope's
        (which a well-formed entry cannot have) refuses the entry.
        """
        admitted = self._admit(entry_id, fields, deliveries, beat)
        if claim is None:
            return admitted
        verdict, key = claim
        held = key if verdict is None else None
        if isinstance(admitted, Refused):
            return admitted if held is None else replace(admitted, dedupe_key=held)
        envelope = admitted[0].envelope
        if key != envelope.dedupe_key.encode():
            return Refused(
                f"malformed entry: its idempotency key read as {key!r} before it was decoded, "
                f"{envelope.dedupe_key!r} after",
                envelope,
                dedupe_key=held,
            )
        return admitted

    def _admit(  # noqa: PLR0911 - one early exit per way an entry can be unusable
        self,
        entry_id: str,
        fields: Fields | None,
        deliveries: int,
        beat: Callable[[Delivery], Awaitable[bool]],
    ) -> Admitted | Refused:
        config = self.rt.config
        if fields is None:
            return Refused("entry was deleted while pending")
        try:
            envelope = decode_fields(fields, max_bytes=config.max_entry_bytes, max_fields=config.max_fields)
        except MalformedEntry as error:
            return Refused(f"malformed entry: {error.reason}")
        signer = self._authenticate(entry_id, envelope)
        if isinstance(signer, Refused):
            return signer
        if deliveries > config.max_deliveries:
            return Refused(
                f"delivery limit of {config.max_deliveries} exceeded "
                "(the handler crashed or stalled on every delivery)",
                envelope,
            )
        route = self.sub.route_for(envelope.type)
        if route is None:
            if self.sub.ignore_unknown:
                return Refused(f"no handler for message type {envelope.type!r}", envelope, dead=False)
            return Refused(f"no handler for message type {envelope.type!r}", envelope)
        if envelope.reply_to and reply_key_stream(envelope) is None:
            return Refused(f"reply_to {envelope.reply_to!r} is not a redsaga stream key", envelope)
        try:
            message = route.decode(envelope)
        except MalformedEntry as error:
            return Refused(f"malformed payload: {error.reason}", envelope)
        stream = self.sub.stream
        delivery = Delivery(
            envelope=envelope,
            stream=stream,
            group=self.sub.group,
            entry_id=entry_id,
            deliveries=deliveries,
            consumer=self.rt.consumer,
            dedupe_key=envelope.dedupe_key if self.sub.idempotent else None,
            principal=signer,
            handler_principal=self.sub.principal,
            _beat=beat,
            _publisher=self.rt.publisher,
            _call=self.rt.completer.call,
            _call_many=self.rt.completer.call_many,
        )
        return delivery, route, message

    def _authenticate(self, entry_id: str, envelope: Envelope) -> str | Refused:
        """Who signed the entry (``""`` with signing off), or its refusal.

        In ``log`` mode a failed check is reported (a warning and an ``unauthenticated``
        incident) and the entry goes on, with the signer it names.
        """
        auth = self.rt.auth
        if not auth.enabled:
            return ""
        try:
            return auth.verify(envelope, self.sub.audience, self.sub.principal, senders=self.sub.senders)
        except Unauthenticated as error:
            if auth.mode == "require":
                return Refused(f"unauthenticated entry: {error.reason}", envelope)
            self.rt.incidents[UNAUTHENTICATED] += 1
            self.log.warning(
                "unauthenticated entry accepted (verification mode 'log')",
                entry=entry_id,
                reason=error.reason,
                incident=UNAUTHENTICATED,
            )
            return envelope.signer
