"""The script calls that move a delivery on: dedupe claim, complete, fail, ack, heartbeat."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Final

from bus._config import BusConfig
from bus._delivery import Delivery
from bus._envelope import Envelope, encode_message
from bus._lua import ACK, COMPLETE_BATCH, DEDUPE_CLAIM, FAIL, HEARTBEAT, RECORD
from bus._scripts import Arg, BatchPart, ScriptCall
from redsaga.ids import derived_id, message_type
from redsaga.streams import Stream

RESULT_PREFIX: Final = b"R"
OVER_QUOTA: Final = b"Q"
"""A dedupe claim's verdict: the group holds its quota of records (``lua/dedupe_claim.lua``)."""
DEDUPE_OVER_QUOTA: Final = "dedupe_over_quota"
"""The incident of a delivery retried because its group held ``BusConfig.dedupe_quota`` records."""
_SEPARATOR: Final = b"\x00"


class Reply:
    """What a handler returns to reply without remembering the result.

    Returning a message replies with it and records it as the first result, so a
    redelivery (or a retry with the same idempotency key) gets the same reply without
    running the handler again. ``Reply(message, remember=False)`` replies but records
    nothing: the next delivery with that key runs the handler again (for example after a
    transient failure that a retry may fix).
    """

    __slots__ = ("message", "remember")

    def __init__(self, message: object, *, remember: bool = True) -> None:
        self.message = message
        self.remember = remember


def encode_result(reply: object | None, config: BusConfig) -> bytes:
    r"""Encode a handler's return value as its dedupe record: ``R<type>\0<payload>``, or ``R``."""
    if isinstance(reply, Reply):
        reply = reply.message
    if reply is None:
        return RESULT_PREFIX
    payload = encode_message(reply, max_bytes=config.max_payload_bytes)
    return RESULT_PREFIX + message_type(type(reply)).encode() + _SEPARATOR + payload


def reply_envelope(
    command: Envelope, result: bytes, *, source: str, consumer: str, now_ms: int
) -> Envelope | None:
    """Build the reply to ``command`` from a recorded result; ``None`` when there is nothing to send."""
    if result == RESULT_PREFIX or not command.reply_to:
        return None
    type_name, _, payload = result[len(RESULT_PREFIX) :].partition(_SEPARATOR)
    return reply_to_command(
        command, type_name.decode(), payload, source=source, now_ms=now_ms, replied_by=consumer
    )


def reply_to_command(
    command: Envelope, type_name: str, payload: bytes, *, source: str, now_ms: int, replied_by: str = ""
) -> Envelope:
    """The reply to ``command``: the one rule every replier follows (handlers, the inbox).

    Its id derives from the command's, so where a reply is published on its own (to another
    slot, from an outbox) a second publish for one delivery is deduped by the publish
    window; it names the command as its cause, so the requester can match it to the
    attempt; the command's headers are carried over, plus ``replied-by`` when given. Its
    idempotency key is its id (left unset: the envelope's default).
    """
    reply_id = derived_id(command.id, "reply")
    headers = {**command.headers, "replied-by": replied_by} if replied_by else command.headers
    return Envelope(
        id=reply_id,
        type=type_name,
        payload=payload,
        source=source,
        correlation_id=command.correlation_id,
        causation_id=command.id,
        created_at_ms=now_ms,
        attempt=command.attempt,
        headers=headers,
    )


def dedupe_keys(delivery: Delivery) -> tuple[str, ...]:
    """The keys of ``delivery``'s group's dedupe records (none when it is not deduped)."""
    if delivery.dedupe_key is None:
        return ()
    return delivery.stream.dedupe_keys(delivery.group)


def dedupe_claim_call(deliveries: Sequence[Delivery], config: BusConfig) -> ScriptCall:
    """Claim the right to run each (deduped) delivery's handler; see ``lua/dedupe_claim.lua``.

    ``deliveries`` are of one stream and group.
    """
    first = deliveries[0]
    args: list[Arg] = [config.lease_ms, first.consumer, config.dedupe_quota]
    for delivery in deliveries:
        args += [delivery.entry_id, delivery.dedupe_key or ""]
    return DEDUPE_CLAIM.call(dedupe_keys(first), args)


def claim_refused(verdict: bytes, config: BusConfig, incidents: Counter[str]) -> str:
    """Why a dedupe claim refused to run a handler (a retry follows).

    ``verdict``: another delivery's in-flight marker (``'I…'``) or :data:`OVER_QUOTA`, which
    counts in ``incidents`` as :data:`DEDUPE_OVER_QUOTA`.
    """
    if verdict != OVER_QUOTA:
        return "another delivery with the same idempotency key is in flight"
    incidents[DEDUPE_OVER_QUOTA] += 1
    return f"the group holds its quota of {config.dedupe_quota} dedupe records (BusConfig.dedupe_quota)"


def record_call(delivery: Delivery, result: bytes, config: BusConfig, *, remember: bool = True) -> ScriptCall:
    """Record ``result`` (unless not ``remember``) without acknowledging: see ``lua/record.lua``."""
    stream = delivery.stream
    args: list[Arg] = [
        delivery.group,
        delivery.consumer,
        delivery.entry_id,
        config.dedupe_ttl_s,
        result if remember else "",
        delivery.dedupe_key or "",
    ]
    return RECORD.call([stream.key, *dedupe_keys(delivery)], args)


def complete_part(
    delivery: Delivery, result: bytes, reply: Envelope | None, config: BusConfig, *, remember: bool = True
) -> BatchPart:
    """Record ``result`` (unless not ``remember``), publish ``reply`` (same slot only), ack.

    One part of a merged ``lua/complete_batch.lua`` call; the outcome per part is that of
    :func:`record_call`. ``reply`` carries ``result``'s payload (:func:`reply_envelope`),
    which goes over the wire once: the script records the reply's payload after the rest
    of ``result``.
    """
    stream = delivery.stream
    record = result if remember else b""
    target = ""
    if reply is not None:
        if record and not record.endswith(reply.payload):
            raise ValueError("a completion's reply must carry the result it records")
        record = record[: len(record) - len(reply.payload)]
        target = Stream.from_key(delivery.envelope.reply_to).key
    key = delivery.dedupe_key or ""
    args: list[Arg] = [delivery.entry_id, key, record, int(delivery.deliveries > 1), target]
    if reply is not None:
        args += reply.field_args()
    return BatchPart(
        COMPLETE_BATCH,
        (stream.key, stream.failures_key(delivery.group), *dedupe_keys(delivery)),
        (delivery.group, delivery.consumer, config.dedupe_ttl_s),
        (),
        tuple(args),
    )


def fail_call(
    delivery: Delivery,
    *,
    dead: bool,
    error: str,
    reason: str,
    delay_ms: int,
    config: BusConfig,
    quota: str = "",
) -> ScriptCall:
    """Schedule a redelivery or dead-letter the entry with its context; see ``lua/fail.lua``."""
    return dead_letter_call(
        delivery.stream,
        delivery.group,
        delivery.consumer,
        delivery.entry_id,
        dead=dead,
        error=error,
        reason=reason,
        delay_ms=delay_ms,
        config=config,
        dedupe_key=delivery.dedupe_key,
        envelope=delivery.envelope,
        quota=quota,
    )


def dead_letter_call(
    stream: Stream,
    group: str,
    consumer: str,
    entry_id: str,
    *,
    dead: bool,
    error: str,
    reason: str,
    config: BusConfig,
    delay_ms: int = 0,
    dedupe_key: str | bytes | None = None,
    envelope: Envelope | None = None,
    quota: str = "",
) -> ScriptCall:
    """The fail call for an entry that may not even decode (``envelope`` is then ``None``).

    ``dedupe_key``: the idempotency key whose in-flight marker is cleared (``None``: none).
    ``quota``: whose dead letters it counts against (``BusConfig.letter_quota``); ``""``: none.
    """
    context: list[Arg] = []
    if envelope is not None:
        context = [
            "type",
            envelope.type,
            "message_id",
            envelope.id,
            "correlation_id",
            envelope.correlation_id,
            "idempotency_key",
            envelope.idempotency_key,
            "attempt",
            envelope.attempt,
        ]
        for name, value in envelope.headers.items():
            context += [f"header.{name}", value]
    keys = [stream.key, stream.failures_key(group)]
    if dedupe_key is not None:
        keys += stream.dedupe_keys(group)
    args: list[Arg] = [
        group,
        consumer,
        entry_id,
        "dead" if dead else "retry",
        error,
        reason,
        delay_ms,
        config.lease_ms,
        config.max_deliveries,
        config.dlq_field_cap_bytes,
        config.max_fields,
        stream.dlq_key,
        quota,
        config.letter_quota,
        config.letter_window_ms,
        dedupe_key or "",
        *context,
    ]
    return FAIL.call(keys, args)


def ack_call(
    stream: Stream, group: str, consumer: str, entry_ids: Sequence[str], *, dedupe_key: bytes | None = None
) -> ScriptCall:
    """Acknowledge entries this consumer still holds (fenced).

    ``dedupe_key``: the idempotency key of the one entry in ``entry_ids``, whose in-flight
    marker is cleared if it is that entry's own (``None``: no marker to clear).
    """
    keys = [stream.key, stream.failures_key(group)]
    if dedupe_key is None:
        return ACK.call(keys, [group, consumer, *entry_ids])
    [entry_id] = entry_ids
    return ACK.call([*keys, *stream.dedupe_keys(group)], [group, consumer, entry_id, dedupe_key])


def heartbeat_call(deliveries: Sequence[Delivery], lease_ms: int) -> ScriptCall:
    """Extend the leases (and in-flight dedupe markers) of deliveries of one stream and group."""
    first = deliveries[0]
    args: list[Arg] = [first.group, first.consumer, lease_ms]
    for delivery in deliveries:
        args.append(delivery.entry_id)
        if delivery.dedupe_key is not None:
            args.append(delivery.dedupe_key)
    return HEARTBEAT.call([first.stream.key, *dedupe_keys(first)], args)


def error_chain(error: BaseException) -> str:
    """Describe an exception and its causes: ``Type: message <- CauseType: message``."""
    links: list[str] = []
    current: BaseException | None = error
    while current is not None and len(links) < 5:
        links.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return " <- ".join(links)[:2000]


def reply_key_stream(envelope: Envelope) -> Stream | None:
    """The stream a reply to ``envelope`` goes to, if it names one that redsaga can parse."""
    if not envelope.reply_to:
        return None
    try:
        return Stream.from_key(envelope.reply_to)
    except ValueError:
        return None
