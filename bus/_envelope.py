"""The envelope: what every stream entry carries, and its encoding as stream fields.

An entry is a flat map of short ASCII field names to bytes, so that ``redis-cli XRANGE``
stays readable and Lua scripts can read a field without decoding anything::

    id      UUIDv7 of the message              type    message type name (the Struct's tag)
    src     source context                     corr    correlation id (the saga id)
    cause   causation id (the message that     idem    idempotency key (stable across retries;
            caused this one)                           left out when it is the id)
    reply   stream key for the reply, if any
    at      created-at, Unix ms                n       attempt number, from 1
    hdr     headers as a JSON object           v       envelope schema version
    data    the payload: the message Struct as JSON
    p       the principal that signed it       k       its key id
    mac     the MAC over the other fields (``bus/_auth.py``)

Schema evolution follows msgspec's rules: new payload fields get defaults, a type name is
never reused for a different shape, and an unsupported ``v`` is dead-lettered, not guessed.
Version 2 leaves ``idem`` out when it equals ``id`` (the MAC covers the key the entry is
deduped on, so the two forms verify alike); version 1 entries are still read.
"""

from __future__ import annotations

import builtins
import time
from typing import Any, Final, TypeVar

import msgspec

from bus._errors import MalformedEntry, PayloadTooLarge
from redsaga.ids import message_type, uuid7

SCHEMA_VERSION: Final = 2
SUPPORTED_SCHEMA_VERSIONS: Final = frozenset({1, 2})
REQUIRED_FIELDS: Final = (b"id", b"type", b"at", b"v", b"data")
_TEXT_FIELDS: Final = (
    (b"src", "source"),
    (b"corr", "correlation_id"),
    (b"cause", "causation_id"),
    (b"idem", "idempotency_key"),
    (b"reply", "reply_to"),
    (b"p", "signer"),
    (b"k", "key_id"),
    (b"mac", "mac"),
)
_TEXT_FIELD_NAMES: Final = tuple((name.decode(), attribute) for name, attribute in _TEXT_FIELDS)
"""The same, named as they are written (str)."""


M = TypeVar("M")
Fields = dict[bytes, bytes]

_encoder = msgspec.json.Encoder()
_canonical_encoder = msgspec.msgpack.Encoder(order="sorted")  # headers: key order is not signed
_headers_decoder = msgspec.json.Decoder(dict[str, str])


class Envelope(msgspec.Struct, gc=False, frozen=True, kw_only=True):
    """One message on a stream: routing and tracing metadata around an encoded payload."""

    id: str
    type: str
    payload: bytes
    source: str = ""
    correlation_id: str = ""
    causation_id: str = ""
    idempotency_key: str = ""
    """The key consumers dedupe on (``""``: the id; see :attr:`dedupe_key`)."""
    reply_to: str = ""
    created_at_ms: int = 0
    attempt: int = 1
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    signer: str = ""
    """The principal that signed the entry (``""``: unsigned); see ``bus/_auth.py``."""
    key_id: str = ""
    mac: str = ""

    @property
    def dedupe_key(self) -> str:
        """The key an idempotent consumer dedupes on: the idempotency key, else the id."""
        return self.idempotency_key or self.id

    def decode(self, message_class: builtins.type[M]) -> M:
        """Decode the payload as ``message_class``; a mismatch raises :class:`MalformedEntry`."""
        try:
            message: M = _decoder(message_class).decode(self.payload)
        except msgspec.DecodeError as error:
            raise MalformedEntry(f"payload is not a valid {self.type}: {error}") from error
        except RecursionError as error:  # msgspec's answer to a deeply nested payload
            raise MalformedEntry(f"payload of {self.type} is nested too deeply to decode") from error
        return message

    def canonical(self, signer: str, key_id: str) -> bytes:
        """The bytes a MAC by ``signer`` with ``key_id`` covers (``bus/_auth.py``).

        Every field that identifies or carries the message, as decoded -- so a writer's field
        or header order, or a default left out, changes nothing -- and not ``created_at_ms``: a timer's
        entry is stamped when Redis fires it, after it was signed. From version 2 the
        idempotency key is covered as :attr:`dedupe_key`, since ``idem`` is left out when it
        is the id.
        """
        idempotency_key = self.idempotency_key if self.schema_version == 1 else self.dedupe_key
        return _canonical_encoder.encode(
            (
                self.id, self.type, self.schema_version, self.payload, self.source, self.correlation_id,
                self.causation_id, idempotency_key, self.reply_to, self.attempt, self.headers,
                signer, key_id,
            )
        )  # fmt: skip

    def to_fields(self) -> dict[str, bytes | str | int]:
        """Encode as stream fields (see the module docstring)."""
        flat = self.field_args()
        return {str(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}

    def field_args(self) -> list[bytes | str | int]:
        """The stream fields as the flat ``name, value, …`` list that XADD and scripts take."""
        args: list[bytes | str | int] = [
            "id",
            self.id,
            "type",
            self.type,
            "at",
            self.created_at_ms,
            "v",
            self.schema_version,
            "data",
            self.payload,
        ]
        for name, attribute in _TEXT_FIELD_NAMES:
            value = getattr(self, attribute)
            if value and (attribute != "idempotency_key" or value != self.id):
                args += (name, value)
        if self.attempt != 1:
            args += ("n", self.attempt)
        if self.headers:
            args += ("hdr", _encoder.encode(self.headers))
        return args


def encode_message(message: object, *, max_bytes: int) -> bytes:
    """Encode a message Struct as the payload, refusing one over ``max_bytes``."""
    payload = _encoder.encode(message)
    if len(payload) > max_bytes:
        raise PayloadTooLarge(len(payload), max_bytes)
    return payload


def new_envelope(
    message: object,
    *,
    max_bytes: int,
    source: str = "",
    correlation_id: str = "",
    causation_id: str = "",
    idempotency_key: str = "",
    reply_to: str = "",
    attempt: int = 1,
    headers: dict[str, str] | None = None,
    message_id: str | None = None,
    now_ms: int | None = None,
) -> Envelope:
    """Wrap ``message`` in a new envelope (fresh UUIDv7 id unless ``message_id`` is given)."""
    return Envelope(
        id=message_id or uuid7(),
        type=message_type(type(message)),
        payload=encode_message(message, max_bytes=max_bytes),
        source=source,
        correlation_id=correlation_id,
        causation_id=causation_id,
        idempotency_key=idempotency_key,
        reply_to=reply_to,
        created_at_ms=time.time_ns() // 1_000_000 if now_ms is None else now_ms,
        attempt=attempt,
        headers=headers or {},
    )


def entry_size(fields: Fields) -> int:
    """Bytes in an entry's field names and values (what an oversize check compares)."""
    return sum(map(len, fields)) + sum(map(len, fields.values()))


def decode_fields(fields: Fields, *, max_bytes: int, max_fields: int) -> Envelope:
    """Decode stream fields into an envelope, or raise :class:`MalformedEntry` saying why.

    Size and field count are checked before anything is decoded, so a hostile entry costs
    nothing but the read.
    """
    if len(fields) > max_fields:
        raise MalformedEntry(f"entry has {len(fields)} fields, more than the limit of {max_fields}")
    size = entry_size(fields)
    if size > max_bytes:
        raise MalformedEntry(f"entry of {size} bytes is over the {max_bytes}-byte limit")
    missing = [name.decode() for name in REQUIRED_FIELDS if name not in fields]
    if missing:
        raise MalformedEntry(f"missing envelope fields: {', '.join(missing)}")
    try:
        version = int(fields[b"v"])
        created_at_ms = int(fields[b"at"])
        attempt = int(fields.get(b"n", b"1"))
        text = {attribute: fields.get(name, b"").decode() for name, attribute in _TEXT_FIELDS}
        message_id = fields[b"id"].decode()
        type_name = fields[b"type"].decode()
        headers = _headers_decoder.decode(fields[b"hdr"]) if b"hdr" in fields else {}
    except (ValueError, msgspec.DecodeError, RecursionError) as error:  # UnicodeDecodeError: a ValueError
        raise MalformedEntry(f"invalid envelope field: {error}") from error
    if version not in SUPPORTED_SCHEMA_VERSIONS:
        raise MalformedEntry(f"unsupported envelope schema version {version}")
    if not message_id or not type_name:
        raise MalformedEntry("envelope id and type must not be empty")
    return Envelope(
        id=message_id,
        type=type_name,
        payload=fields[b"data"],
        created_at_ms=created_at_ms,
        attempt=attempt,
        headers=headers,
        schema_version=version,
        **text,
    )


_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _decoder(message_class: type[M]) -> msgspec.json.Decoder[M]:
    decoder = _decoders.get(message_class)
    if decoder is None:
        decoder = _decoders[message_class] = msgspec.json.Decoder(message_class)
    return decoder
