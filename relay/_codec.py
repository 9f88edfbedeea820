"""How an envelope is stored in an outbox row: msgpack of :class:`bus.Envelope`.

msgpack keeps the payload bytes as they are (no base64) and follows msgspec's evolution
rules: a field added to ``Envelope`` with a default decodes from rows written before it.
"""

from __future__ import annotations

from typing import Final

import msgspec

from bus import Envelope, MalformedEntry

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(Envelope)


def encode_envelope(envelope: Envelope) -> bytes:
    """Encode ``envelope`` for the ``envelope`` column."""
    return _encoder.encode(envelope)


def decode_envelope(blob: bytes) -> Envelope:
    """Decode an ``envelope`` column; a corrupt value raises :class:`bus.MalformedEntry`."""
    try:
        return _decoder.decode(blob)
    except (msgspec.DecodeError, RecursionError) as error:
        raise MalformedEntry(f"outbox row holds no valid envelope: {error}") from error
