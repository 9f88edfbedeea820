"""Dead-letter tools: read, filter, requeue and purge the letters in ``rs:{tag}:dlq``.

A letter's fields are written by ``lua/fail.lua`` (and by the consumer for entries lost
while pending): where the entry came from (stream, entry id, group, consumer), why it died
(reason, delivery count, error chain, first and last failure time), the envelope's context
when it decoded (type, message id, correlation id, idempotency key, headers) and a copy of
its raw fields (``raw.<field>``, each cut to ``BusConfig.dlq_field_cap_bytes``; the packed
envelope field is shown decoded, item by item).

Requeueing re-adds the raw copy to the stream it came from and removes the letter in one
script (``lua/requeue.lua``), keyed by the letter id, so it is safe to repeat. Reading is
a bounded XRANGE walk; nothing here scans the keyspace.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from bus._client import Redis
from bus._envelope import describe_packed
from bus._errors import redis_errors
from bus._scripts import Script
from redsaga.streams import Stream

REQUEUE: Final = Script.load("bus", "requeue")
_ENTRY_ID: Final = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")
_BATCH: Final = 500
_KNOWN: Final = frozenset(
    {
        "stream",
        "entry",
        "group",
        "consumer",
        "deliveries",
        "reason",
        "errors",
        "first_failed_ms",
        "last_failed_ms",
        "type",
        "message_id",
        "correlation_id",
        "idempotency_key",
        "raw_truncated",
        "raw_missing",
    }
)
_errors_decoder = msgspec.json.Decoder(list[str])


class DeadLetter(msgspec.Struct, kw_only=True):
    """One letter of a dead-letter stream, decoded (raw bytes shown as text).

    Attributes:
        dlq: The dead-letter stream's key.
        id: The letter's entry id in it.
        stream: The stream the dead entry was on.
        entry: The dead entry's id on that stream.
        group: The consumer group that gave up on it.
        consumer: The consumer that held it last.
        deliveries: How often it was delivered.
        reason: Why it was dead-lettered.
        errors: The failures recorded for it, oldest first (each an error chain).
        first_failed_ms: When it first failed.
        last_failed_ms: When it was dead-lettered.
        type: The envelope's message type, when it decoded.
        message_id: The envelope's id.
        correlation_id: The envelope's correlation id (a saga id for saga traffic).
        idempotency_key: The envelope's idempotency key.
        headers: The envelope's headers.
        raw: The copy of the entry's fields (its packed envelope ``e`` as a JSON object).
        raw_truncated: Whether a field or the field list was cut to the caps.
        raw_missing: Whether the entry itself was gone when it died.
        extra: Any other field.

    """

    dlq: str
    id: str
    stream: str = ""
    entry: str = ""
    group: str = ""
    consumer: str = ""
    deliveries: int | None = None
    reason: str = ""
    errors: list[str] = msgspec.field(default_factory=list)
    first_failed_ms: int | None = None
    last_failed_ms: int | None = None
    type: str = ""
    message_id: str = ""
    correlation_id: str = ""
    idempotency_key: str = ""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    raw: dict[str, str] = msgspec.field(default_factory=dict)
    raw_truncated: bool = False
    raw_missing: bool = False
    extra: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def requeueable(self) -> bool:
        """Whether the letter holds a full copy of the entry."""
        return bool(self.raw) and not (self.raw_truncated or self.raw_missing)


class Requeued(msgspec.Struct, kw_only=True):
    """What happened to one letter asked to be requeued.

    ``outcome`` is ``requeued`` (``new_entry`` is its new id on ``stream``), ``gone`` (no
    such letter any more: requeued or purged already) or ``refused`` (``why``).
    """

    letter: str
    stream: str
    outcome: Literal["requeued", "gone", "refused"]
    new_entry: str = ""
    why: str = ""


@dataclass(frozen=True, slots=True)
class LetterFilter:
    """Which letters an operation applies to; every given criterion must match.

    Attributes:
        ids: Letter ids (entry ids in the dead-letter stream).
        stream: The source stream: its full key, or its name (``inbox``, ``cmd:payments``).
        reason: Text the reason contains (case-insensitive).
        type: The message type.
        correlation_id: The correlation (saga) id.

    """

    ids: tuple[str, ...] = ()
    stream: str | None = None
    reason: str | None = None
    type: str | None = None
    correlation_id: str | None = None

    def matches(self, letter: DeadLetter) -> bool:
        """Whether ``letter`` meets every criterion."""
        if self.ids and letter.id not in self.ids:
            return False
        if self.stream and self.stream not in (letter.stream, _name_of(letter.stream)):
            return False
        if self.reason and self.reason.lower() not in letter.reason.lower():
            return False
        if self.type and self.type != letter.type:
            return False
        return not (self.correlation_id and self.correlation_id != letter.correlation_id)


def decode_letter(dlq: str, letter_id: str, fields: dict[bytes, bytes]) -> DeadLetter:
    """Decode one letter's fields."""
    text = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()}
    letter = DeadLetter(
        dlq=dlq,
        id=letter_id,
        stream=text.get("stream", ""),
        entry=text.get("entry", ""),
        group=text.get("group", ""),
        consumer=text.get("consumer", ""),
        deliveries=_int(text.get("deliveries")),
        reason=text.get("reason", ""),
        errors=_errors(text.get("errors")),
        first_failed_ms=_int(text.get("first_failed_ms")),
        last_failed_ms=_int(text.get("last_failed_ms")),
        type=text.get("type", ""),
        message_id=text.get("message_id", ""),
        correlation_id=text.get("correlation_id", ""),
        idempotency_key=text.get("idempotency_key", ""),
        raw_truncated=text.get("raw_truncated") == "1",
        raw_missing=text.get("raw_missing") == "1",
    )
    for name, value in text.items():
        if name == "raw.e":  # the packed envelope: shown item by item, not as mangled bytes
            letter.raw["e"] = describe_packed(fields[b"raw.e"])
        elif name.startswith("raw."):
            letter.raw[name[4:]] = value
        elif name.startswith("header."):
            letter.headers[name[7:]] = value
        elif name not in _KNOWN:
            letter.extra[name] = value
    return letter


async def dead_letters(
    redis: Redis, dlqs: Sequence[str], where: LetterFilter | None = None, *, limit: int | None = 100
) -> list[DeadLetter]:
    """The letters of ``dlqs`` that match ``where``, oldest first per stream, at most ``limit``."""
    where = where or LetterFilter()
    found: list[DeadLetter] = []
    for dlq in dlqs:
        if where.ids:
            found += [letter for letter in await _by_ids(redis, dlq, where.ids) if where.matches(letter)]
        else:
            async for letter in _walk(redis, dlq):
                if where.matches(letter):
                    found.append(letter)
                    if limit is not None and len(found) >= limit:
                        return found
    return found if limit is None else found[:limit]


async def dead_letter_sizes(redis: Redis, dlqs: Sequence[str]) -> dict[str, int]:
    """How many letters each dead-letter stream holds."""
    sizes = {}
    with redis_errors():
        for dlq in dlqs:
            sizes[dlq] = int(await redis.xlen(dlq))
    return sizes


async def requeue(redis: Redis, letters: Sequence[DeadLetter]) -> list[Requeued]:
    """Put each letter's entry back on its stream (one atomic script per letter)."""
    results = []
    for letter in letters:
        try:
            target = Stream.from_key(letter.stream)
        except ValueError:
            results.append(_refused(letter, f"{letter.stream!r} is not a redsaga stream"))
            continue
        if target.dlq_key != letter.dlq:
            results.append(_refused(letter, "the stream is not in the dead-letter stream's hash tag"))
            continue
        reply: Any = await REQUEUE(redis, [letter.dlq, target.key], [letter.id])
        outcome = _text(reply[0])
        if outcome == "requeued":
            results.append(
                Requeued(
                    letter=letter.id, stream=letter.stream, outcome="requeued", new_entry=_text(reply[1])
                )
            )
        elif outcome == "gone":
            results.append(Requeued(letter=letter.id, stream=letter.stream, outcome="gone"))
        else:
            results.append(_refused(letter, _text(reply[1])))
    return results


async def purge(redis: Redis, letters: Sequence[DeadLetter]) -> int:
    """Delete the letters; return how many were still there."""
    deleted = 0
    by_dlq: dict[str, list[str]] = {}
    for letter in letters:
        by_dlq.setdefault(letter.dlq, []).append(letter.id)
    with redis_errors():
        for dlq, ids in by_dlq.items():
            for start in range(0, len(ids), _BATCH):
                deleted += int(await redis.xdel(dlq, *ids[start : start + _BATCH]))
    return deleted


async def _by_ids(redis: Redis, dlq: str, ids: Sequence[str]) -> list[DeadLetter]:
    letters = []
    with redis_errors():
        for letter_id in ids:
            if not _ENTRY_ID.match(letter_id):
                continue  # not a stream entry id: no such letter
            rows: Any = await redis.xrange(dlq, letter_id, letter_id)
            letters += [decode_letter(dlq, _text(i), f) for i, f in rows]
    return letters


async def _walk(redis: Redis, dlq: str) -> Any:
    start = "-"
    while True:
        with redis_errors():
            rows: Any = await redis.xrange(dlq, start, "+", count=_BATCH)
        for entry_id, fields in rows:
            yield decode_letter(dlq, _text(entry_id), fields)
        if len(rows) < _BATCH:
            return
        start = "(" + _text(rows[-1][0])


def _refused(letter: DeadLetter, why: str) -> Requeued:
    return Requeued(letter=letter.id, stream=letter.stream, outcome="refused", why=why)


def _name_of(stream_key: str) -> str:
    try:
        return Stream.from_key(stream_key).name
    except ValueError:
        return stream_key


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _errors(value: str | None) -> list[str]:
    if not value or value == "{}":  # Lua's cjson writes an empty list as {}
        return []
    try:
        return _errors_decoder.decode(value)
    except msgspec.DecodeError:
        return [value]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
