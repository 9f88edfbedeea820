"""The envelope: what every stream entry carries, and its encoding as stream fields.

An entry has two fields: ``e``, the envelope's metadata packed as one MessagePack array
(one argument for Redis to copy and one value for a reader to decode), and ``data``, the
payload as JSON, on its own so that ``redis-cli XRANGE`` shows it and a Lua script copies it
without decoding anything (``lua/complete_batch.lua`` records a reply's payload from it)::

    e       [v, id, type, at, src, corr, cause, idem, reply, n, hdr, p, k, mac]
    data    the payload: the message Struct as JSON

    v       envelope schema version (3)         id      UUIDv7 of the message
    type    message type name (the Struct's     at      created-at, Unix ms
            tag)                                src     source context
    corr    correlation id (the saga id)        cause   causation id (the message that
    idem    idempotency key, stable across              caused this one)
            retries ("": it is the id)          reply   stream key for the reply ("": none)
    n       attempt number, from 1              hdr     headers, a map of strings
    p       the principal that signed it        k       its key id
    mac     the MAC over the decoded envelope (``bus/_auth.py``): 16 raw bytes (bin), or
            empty when unsigned

Every item is always there (an empty string, ``1``, an empty map), so a reader checks one
fixed shape. Schema evolution follows msgspec's rules: new payload fields get defaults, a
type name is never reused for a different shape, and an unsupported ``v`` is dead-lettered,
not guessed. Entries of the flat layouts before version 3 (a field per item) are not read.
"""

from __future__ import annotations

import builtins
import re
import time
from typing import Any, Final, TypeVar

import msgspec

from bus._errors import MalformedEntry, PayloadTooLarge
from redsaga.ids import message_type, uuid7

SCHEMA_VERSION: Final = 3
PACKED_ITEMS: Final = (
    "v", "id", "type", "at", "src", "corr", "cause", "idem", "reply", "n", "hdr", "p", "k", "mac",
)  # fmt: skip
"""The items of the ``e`` field, in order (the names the module docstring gives them)."""


M = TypeVar("M")
Fields = dict[bytes, bytes]
_Packed = tuple[int, str, str, int, str, str, str, str, str, int, dict[str, str], str, str, bytes]

_encoder = msgspec.json.Encoder()
_packer = msgspec.msgpack.Encoder()
_canonical_encoder = msgspec.msgpack.Encoder(order="sorted")  # headers: key order is not signed
_unpacker = msgspec.msgpack.Decoder(_Packed)
_POSITION = re.compile(r"\$\[(\d+)\]")


class _Version(msgspec.Struct, array_like=True):
    """The first item of a packed envelope of any version (read to say why one is refused)."""

    v: int


_version_decoder = msgspec.msgpack.Decoder(_Version)


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
    mac: bytes = b""
    """The MAC over :meth:`canonical` (``b""``: unsigned), as raw bytes."""

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

        Every field that identifies or carries the message, as decoded -- so how a writer
        packed it, its header order, or an idempotency key left empty because it is the
        id, changes nothing -- and not ``created_at_ms``: a timer's entry is stamped when
        Redis fires it, after it was signed. The idempotency key is covered as
        :attr:`dedupe_key`, the key the entry is deduped on.
        """
        return _canonical_encoder.encode(
            (
                self.id, self.type, self.schema_version, self.payload, self.source, self.correlation_id,
                self.causation_id, self.dedupe_key, self.reply_to, self.attempt, self.headers,
                signer, key_id,
            )
        )  # fmt: skip

    def to_fields(self) -> dict[str, bytes | str | int]:
        """Encode as stream fields (see the module docstring)."""
        return {"e": self.packed(), "data": self.payload}

    def field_args(self) -> list[bytes | str | int]:
        """The stream fields as the flat ``name, value, …`` list that XADD and scripts take.

        Always ``e``, its value, ``data``, the payload: scripts rely on the payload being last.
        """
        return [b"e", self.packed(), b"data", self.payload]

    def packed(self) -> bytes:
        """The ``e`` field: everything but the payload, as a MessagePack array."""
        return _packer.encode(
            (
                self.schema_version, self.id, self.type, self.created_at_ms, self.source,
                self.correlation_id, self.causation_id,
                "" if self.idempotency_key == self.id else self.idempotency_key,
                self.reply_to, self.attempt, self.headers, self.signer, self.key_id, self.mac,
            )
        )  # fmt: skip


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


_PACKED_NAMES_SIZE: Final = len(b"e") + len(b"data")


def entry_size(fields: Fields) -> int:
    """Bytes in an entry's field names and values (what an oversize check compares)."""
    size = 0
    for name, value in fields.items():
        size += len(name) + len(value)
    return size


def decode_fields(fields: Fields, *, max_bytes: int, max_fields: int) -> Envelope:
    """Decode stream fields into an envelope, or raise :class:`MalformedEntry` saying why.

    Size and field count are checked before anything is decoded, so a hostile entry costs
    nothing but the read; the packed field is decoded against one fixed shape, so hostile
    MessagePack (deep nesting, wrong types, lengths past its end) is refused at its first
    wrong byte.
    """
    if len(fields) > max_fields:
        raise MalformedEntry(f"entry has {len(fields)} fields, more than the limit of {max_fields}")
    packed, payload = fields.get(b"e"), fields.get(b"data")
    if len(fields) == 2 and packed is not None and payload is not None:  # every entry the bus writes
        size = _PACKED_NAMES_SIZE + len(packed) + len(payload)
    else:
        size = entry_size(fields)
    if size > max_bytes:
        raise MalformedEntry(f"entry of {size} bytes is over the {max_bytes}-byte limit")
    if packed is None or payload is None:
        raise MalformedEntry(_missing(fields))
    try:
        (
            version, message_id, type_name, created_at_ms, source, correlation_id, causation_id,
            idempotency_key, reply_to, attempt, headers, signer, key_id, mac,
        ) = _unpacker.decode(packed)  # fmt: skip
    except msgspec.DecodeError as error:  # typed item by item: nesting cannot go deeper than hdr
        raise MalformedEntry(_invalid(packed, error)) from error
    if version != SCHEMA_VERSION:
        raise MalformedEntry(f"unsupported envelope schema version {version}")
    if not message_id or not type_name:
        raise MalformedEntry("envelope id and type must not be empty")
    return Envelope(
        id=message_id,
        type=type_name,
        payload=payload,
        source=source,
        correlation_id=correlation_id,
        causation_id=causation_id,
        idempotency_key=idempotency_key,
        reply_to=reply_to,
        created_at_ms=created_at_ms,
        attempt=attempt,
        headers=headers,
        schema_version=version,
        signer=signer,
        key_id=key_id,
        mac=mac,
    )


def describe_packed(packed: bytes) -> str:
    """A packed envelope field as text a person reads (a dead letter's raw copy).

    A JSON object of its items by name (the MAC in base64), or, when it does not decode,
    its bytes with everything that is not UTF-8 escaped.
    """
    try:
        items = _unpacker.decode(packed)
    except msgspec.DecodeError:
        return packed.decode(errors="backslashreplace")
    return _encoder.encode(dict(zip(PACKED_ITEMS, items, strict=True))).decode()


def _missing(fields: Fields) -> str:
    """Why an entry without its ``e`` or ``data`` field is refused."""
    if b"e" not in fields and b"v" in fields:  # a flat entry of the layouts before version 3
        version = fields[b"v"][:16].decode(errors="backslashreplace")
        return f"unsupported envelope schema version {version} (its fields are not packed)"
    missing = ", ".join(name.decode() for name in (b"e", b"data") if name not in fields)
    return f"missing envelope fields: {missing}"


def _invalid(packed: bytes, error: msgspec.DecodeError) -> str:
    """Why a packed field that does not decode is refused: its version, else the item at fault."""
    try:
        version: int | None = _version_decoder.decode(packed).v
    except (msgspec.DecodeError, RecursionError):  # the items after the first are skipped, not typed
        version = None
    if version is not None and version != SCHEMA_VERSION:
        return f"unsupported envelope schema version {version}"
    found = _POSITION.search(str(error))
    if found and int(found.group(1)) < len(PACKED_ITEMS):
        return f"invalid envelope field {PACKED_ITEMS[int(found.group(1))]}: {error}"
    return f"invalid envelope field: {error}"


_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def _decoder(message_class: type[M]) -> msgspec.json.Decoder[M]:
    decoder = _decoders.get(message_class)
    if decoder is None:
        decoder = _decoders[message_class] = msgspec.json.Decoder(message_class)
    return decoder
