"""The envelope's stream fields: two of them, read back as written, refused with a reason."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bus
from bus._envelope import PACKED_ITEMS, describe_packed
from tests.helpers import as_fields, envelope_items, raw_entry

LIMITS = {"max_bytes": 1 << 20, "max_fields": 32}
text = st.text(max_size=300)
envelopes = st.builds(
    bus.Envelope,
    id=text.filter(bool),
    type=text.filter(bool),
    payload=st.binary(max_size=300),
    source=text,
    correlation_id=text,
    causation_id=text,
    idempotency_key=text,
    reply_to=text,
    created_at_ms=st.integers(0, 2**63 - 1),
    attempt=st.integers(-(2**63), 2**63 - 1),
    headers=st.dictionaries(text, text, max_size=5),
    signer=text,
    key_id=text,
    mac=st.binary(max_size=16),
)


@given(envelopes)
def test_an_envelope_reads_back_as_written(envelope: bus.Envelope) -> None:
    read = bus.decode_fields(as_fields(envelope), **LIMITS)
    if envelope.idempotency_key == envelope.id:  # written empty: it is the id
        envelope = msgspec.structs.replace(envelope, idempotency_key="")
    assert read == envelope
    assert read.dedupe_key == (envelope.idempotency_key or envelope.id)


def test_an_entry_is_the_packed_envelope_then_the_payload_last() -> None:
    envelope = bus.new_envelope(msgspec.Struct(), max_bytes=100, correlation_id="s1", headers={"step": "a"})
    args = envelope.field_args()
    assert args[0::2] == [b"e", b"data"]
    assert args[-1] == envelope.payload  # complete_batch.lua records a reply's payload from here
    items = envelope_items(as_fields(envelope))
    assert list(items) == list(PACKED_ITEMS)
    assert (items["v"], items["corr"], items["hdr"], items["idem"], items["mac"]) == (
        3,
        "s1",
        {"step": "a"},
        "",
        b"",
    )


def test_size_and_field_count_are_checked_before_anything_is_decoded() -> None:
    hostile = {b"e": b"\x9e\x03" + b"\x91" * 5000 + b"\x90", b"data": b"{}"}
    with pytest.raises(bus.MalformedEntry, match="over the 100-byte limit"):
        bus.decode_fields(hostile, max_bytes=100, max_fields=32)
    with pytest.raises(bus.MalformedEntry, match="entry has 2 fields, more than the limit of 1"):
        bus.decode_fields(hostile, max_bytes=1 << 20, max_fields=1)
    with pytest.raises(bus.MalformedEntry, match="invalid envelope field id"):
        bus.decode_fields(hostile, **LIMITS)


@pytest.mark.parametrize(
    "extra", [{}, {b"x": b"yz"}, {b"v": b"2"}], ids=["the two fields", "a third field", "a flat entry"]
)
def test_an_entry_at_the_limit_is_read_and_one_byte_more_is_refused(extra: dict[bytes, bytes]) -> None:
    envelope = bus.new_envelope(msgspec.Struct(), max_bytes=100, correlation_id="s1")
    fields = {**as_fields(envelope), **extra}
    size = sum(len(name) + len(value) for name, value in fields.items())
    assert bus.decode_fields(fields, max_bytes=size, max_fields=32).correlation_id == "s1"
    with pytest.raises(bus.MalformedEntry, match=f"entry of {size} bytes is over the {size - 1}-byte limit"):
        bus.decode_fields(fields, max_bytes=size - 1, max_fields=32)


def test_an_entry_of_two_fields_but_not_the_envelope_s_is_sized_and_refused() -> None:
    fields = {b"e": b"x" * 50, b"other": b"y" * 60}
    with pytest.raises(bus.MalformedEntry, match="entry of 116 bytes is over the 115-byte limit"):
        bus.decode_fields(fields, max_bytes=115, max_fields=32)
    with pytest.raises(bus.MalformedEntry, match="missing envelope fields: data"):
        bus.decode_fields(fields, max_bytes=116, max_fields=32)


def test_a_dead_letter_shows_the_packed_envelope_by_item_or_its_bytes_escaped() -> None:
    fields = raw_entry(id="m1", type="Charge", corr="s1", mac=b"\x00\xff")
    shown = msgspec.json.decode(describe_packed(fields[b"e"]))
    assert shown == {**dict.fromkeys(PACKED_ITEMS, ""), "v": 3, "id": "m1", "type": "Charge", "at": 1,
                     "corr": "s1", "n": 1, "hdr": {}, "mac": "AP8="}  # fmt: skip
    assert describe_packed(fields[b"e"][:-1]) == fields[b"e"][:-1].decode(errors="backslashreplace")
    assert describe_packed(b"\x93\xff\x00") == "\\x93\\xff\x00"
