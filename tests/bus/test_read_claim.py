"""An idempotent group reads its entries and claims their keys in one call (``lua/read_claim.lua``),
behind a wake-up that consumes nothing: the claims made at read, the markers of entries refused
after it cleared, the Lua reader of a packed envelope's key, and a wake-up that does not spin
when other consumers of the group take the entries. On fakeredis, real Redis and the cluster."""

from __future__ import annotations

import time
from typing import Any

import anyio
import msgspec
import pytest

import bus
from bus import Bus, Delivery, Worker
from bus._intake import NO_CLAIM
from bus._lua import READ_CLAIM
from bus._outcomes import encode_result
from tests.bus.test_auth import ORDERS, PAYMENTS, auth, keyring
from tests.bus.test_contract import (
    COMMANDS,
    CONFIG,
    RECORDS,
    Charge,
    Charged,
    payments_app,
    publish_charge,
    put_record,
    replies,
)
from tests.helpers import dead_letters, pending, raw_entry

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
GROUP = "payments"


async def read_claim(redis: bus.Redis, consumer: str = "c1", count: int = 100) -> tuple[bytes, list[Any]]:
    """One call of the function: the id to wait after, and one [id, fields, verdict, key] per entry."""
    keys = [COMMANDS.key, *COMMANDS.dedupe_keys(GROUP)]
    after, entries = await READ_CLAIM(redis, keys, [GROUP, consumer, count, 10_000, 1_000])
    return after, entries


def str_form(text: str, form: str) -> bytes:
    """``text`` packed as the MessagePack str ``form`` (fixstr, str8, str16, str32)."""
    data = text.encode()
    if form == "fixstr":
        return bytes([0xA0 + len(data)]) + data
    width = {"str8": 1, "str16": 2, "str32": 4}[form]
    return bytes([0xD9 + width.bit_length() - 1]) + len(data).to_bytes(width, "big") + data


def int_form(value: int, form: str) -> bytes:
    """``value`` packed as the MessagePack int ``form`` (fixint, uint8 … int64)."""
    if form == "fixint":
        return value.to_bytes(1, "big", signed=value < 0)
    signed, bits = form.startswith("int"), int(form.removeprefix("u").removeprefix("int"))
    first = (0xD0 if signed else 0xCC) + (bits // 8).bit_length() - 1
    return bytes([first]) + value.to_bytes(bits // 8, "big", signed=signed)


TAIL = msgspec.msgpack.encode(["", 1, {}, "", "", b""])[1:]  # reply, n, hdr, p, k, mac: not read


def packed(*items: bytes, header: bytes = b"\x9e") -> dict[bytes, bytes]:
    """An entry whose ``e`` is ``header`` and the eight items before ``reply``, packed by hand."""
    return {b"e": header + b"".join(items) + TAIL, b"data": b"{}"}


def envelope(
    msg_id: bytes, idem: bytes, *, v: bytes = b"\x03", at: bytes = b"\x01", header: bytes = b"\x9e"
) -> dict[bytes, bytes]:
    empty = b"\xa0"
    return packed(v, msg_id, str_form("Charge", "fixstr"), at, empty, empty, empty, idem, header=header)


INT_FORMS = [
    ("fixint", 5), ("fixint", -3), ("uint8", 200), ("uint16", 60_000), ("uint32", 4_000_000_000),
    ("uint64", 1_733_400_000_000), ("int8", -100), ("int16", -30_000), ("int32", -2_000_000_000),
    ("int64", -(2**40)),
]  # fmt: skip
STR_FORMS = ["fixstr", "str8", "str16", "str32"]
READ: list[tuple[dict[bytes, bytes], bytes]] = [
    # every int form, as v and as created-at; the id is the key (idem "")
    *(
        (
            envelope(str_form(f"id-{n}", "fixstr"), b"\xa0", v=int_form(i, f), at=int_form(i, f)),
            f"id-{n}".encode(),
        )
        for n, (f, i) in enumerate(INT_FORMS)
    ),
    # every str form, as the id and as the idempotency key, short and long
    *((envelope(str_form("i", f), str_form(f"key-{f}", f)), f"key-{f}".encode()) for f in STR_FORMS),
    (envelope(str_form("x" * 40, "str8"), str_form("k" * 300, "str16")), b"k" * 300),
    (envelope(str_form("long-id-" + "y" * 200, "str8"), b"\xa0"), ("long-id-" + "y" * 200).encode()),
    # an array 16 and an array 32 header, and more items than the fourteen
    (envelope(str_form("a16", "fixstr"), b"\xa0", header=b"\xdc\x00\x0e"), b"a16"),
    (envelope(str_form("a32", "fixstr"), b"\xa0", header=b"\xdd\x00\x00\x00\x0e"), b"a32"),
    (envelope(str_form("a15", "fixstr"), b"\xa0", header=b"\x9f"), b"a15"),
]
UNREAD: list[dict[bytes, bytes]] = [
    envelope(str_form("seven", "fixstr"), b"\xa0", header=b"\x97"),  # fewer than eight items
    envelope(str_form("map", "fixstr"), b"\xa0", header=b"\x8e"),  # not an array
    envelope(b"\xc4\x02id", b"\xa0"),  # the id a bin
    envelope(str_form("f", "fixstr"), b"\xa0", at=b"\xcb" + bytes(8)),  # created-at a float
    envelope(str_form("n", "fixstr"), b"\xc0"),  # the idempotency key nil
    {b"e": b"\x9e\x03\xaaabc", b"data": b"{}"},  # a str that ends early
    {b"e": b"\x9e\x03\xda\x00", b"data": b"{}"},  # a str 16 whose length ends early
    {b"e": b"\xdc\x00", b"data": b"{}"},  # an array 16 whose length ends early
    {b"e": b"", b"data": b"{}"},
    {b"data": b"{}"},  # no envelope at all
]


async def test_the_key_reader_reads_every_int_and_str_form_and_claims_nothing_it_cannot_read(
    redis: bus.Redis,
) -> None:
    await redis.xgroup_create(COMMANDS.key, GROUP, id="0", mkstream=True)
    for fields, _ in READ:
        await redis.xadd(COMMANDS.key, fields)  # type: ignore[arg-type]
    unread = [(await redis.xadd(COMMANDS.key, f)).decode() for f in UNREAD]  # type: ignore[arg-type]

    _, entries = await read_claim(redis)

    assert [(key, verdict) for _, _, verdict, key in entries[: len(READ)]] == [(k, None) for _, k in READ]
    assert [(i.decode(), v, k) for i, _, v, k in entries[len(READ) :]] == [(i, NO_CLAIM, b"") for i in unread]
    assert await redis.hlen(RECORDS) == len(READ)  # a marker per key read, none for the rest


async def test_the_key_reader_agrees_with_the_envelope_codec(redis: bus.Redis) -> None:
    await redis.xgroup_create(COMMANDS.key, GROUP, id="0", mkstream=True)
    with_key = await publish_charge(redis, "o1", key="k" * 40)
    without = await bus.Publisher(redis).publish(COMMANDS, Charge(order="o2", amount=1), message_id="m-2")
    for fields in (raw_entry(idem="saga-1:charge", at=2**50, n=3), raw_entry(id="m-3", v=3)):
        await redis.xadd(COMMANDS.key, fields)  # type: ignore[arg-type]
    _, entries = await read_claim(redis)
    decoded = [
        bus.decode_fields(dict(zip(f[::2], f[1::2], strict=True)), max_bytes=1 << 20, max_fields=32)
        for _, f, _, _ in entries
    ]
    assert [k.decode() for _, _, _, k in entries] == [e.dedupe_key for e in decoded]
    assert with_key
    assert without
    assert decoded[1].dedupe_key == "m-2"


async def test_a_read_claims_each_key_and_answers_with_first_results_and_markers(redis: bus.Redis) -> None:
    await redis.xgroup_create(COMMANDS.key, GROUP, id="0", mkstream=True)
    first = encode_result(Charged(order="o1", receipt="first"), CONFIG)
    await put_record(redis, "saga-o1:charge", first)
    await put_record(redis, "saga-o2:charge", b"I1-1|another-consumer")
    for order in ("o1", "o2", "o3"):
        await publish_charge(redis, order)
    again = await redis.xadd(COMMANDS.key, (await redis.xrange(COMMANDS.key))[-1][1])  # o3's key twice

    after, entries = await read_claim(redis)

    o3 = entries[2][0]
    assert [verdict for _, _, verdict, _ in entries] == [
        first,
        b"I1-1|another-consumer",
        None,
        b"I" + o3 + b"|c1",
    ]
    assert after == again
    assert await redis.hget(RECORDS, "saga-o3:charge") == b"I" + o3 + b"|c1"  # claimed as it was read
    assert await redis.hget(RECORDS, "saga-o2:charge") == b"I1-1|another-consumer"  # the holder's, kept
    assert await read_claim(redis) == (again, [])  # nothing new: the group's last-delivered id


async def test_a_worker_answers_a_first_result_and_runs_a_new_key_without_a_claim_of_its_own(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoClaim:
        def call(self, *_: object) -> None:
            raise AssertionError("claimed after the read")

    monkeypatch.setattr("bus._outcomes.DEDUPE_CLAIM", NoClaim())
    await put_record(redis, "saga-o1:charge", encode_result(Charged(order="o1", receipt="first"), CONFIG))
    worker = Worker(redis, payments_app(effects := []), config=CONFIG)
    await worker.setup()
    for order in ("o1", "o2"):
        await publish_charge(redis, order)
    await worker.run_until_idle()

    assert effects == ["o2"]
    assert sorted(r.decode(Charged).receipt for r in await replies(redis)) == ["first", "r-o2"]
    assert await pending(redis, COMMANDS, GROUP) == []


async def test_a_key_in_flight_elsewhere_is_turned_away_at_read_and_its_holder_keeps_the_marker(
    redis: bus.Redis,
) -> None:
    await put_record(redis, "saga-o1:charge", b"I1-1|another-consumer")
    worker = Worker(redis, payments_app(effects := []), config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    await worker.run_until_idle()

    assert effects == []
    assert await redis.hget(RECORDS, "saga-o1:charge") == b"I1-1|another-consumer"
    assert [p["deliveries"] for p in await pending(redis, COMMANDS, GROUP)] == [1]  # a retry follows


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (raw_entry(type="Refund"), "no handler for message type 'Refund'"),
        (raw_entry(data='{"order": 5}'), "malformed payload"),
        (raw_entry(id=msgspec.Raw(b"\xa1\xff")), "invalid envelope field: Invalid UTF-8"),
        (raw_entry(v=9), "unsupported envelope schema version 9"),
        (raw_entry(reply="not-a-stream"), "is not a redsaga stream key"),
        ({b"e": b"\x9e\x03garbage", b"data": b"{}"}, "malformed entry"),
    ],
)
async def test_an_entry_refused_after_its_read_claimed_it_is_dead_lettered_and_leaves_no_marker(
    redis: bus.Redis, fields: dict[bytes, bytes], reason: str
) -> None:
    worker = Worker(redis, payments_app(effects := []), config=CONFIG)
    await worker.setup()
    await redis.xadd(COMMANDS.key, fields)  # type: ignore[arg-type]
    await publish_charge(redis, "good")
    await worker.run_until_idle()

    assert effects == ["good"]
    [letter] = await dead_letters(redis, COMMANDS)
    assert reason in letter["reason"]
    assert await redis.hkeys(RECORDS) == [b"saga-good:charge"]  # its first result; no marker
    assert await pending(redis, COMMANDS, GROUP) == []


async def test_an_envelope_whose_key_reads_otherwise_before_it_is_decoded_is_refused(
    redis: bus.Redis,
) -> None:
    """An entry may hold a field twice: the script reads the first ``e``, the decoder the last."""
    worker = Worker(redis, payments_app(effects := []), config=CONFIG)
    await worker.setup()
    first, last = raw_entry(idem="key-1")[b"e"], raw_entry(idem="key-2")[b"e"]
    data = msgspec.json.encode(Charge(order="o1", amount=1))
    await redis.execute_command("XADD", COMMANDS.key, "*", "e", first, "data", data, "e", last)
    await worker.run_until_idle()

    assert effects == []
    [letter] = await dead_letters(redis, COMMANDS)
    assert "idempotency key read as b'key-1' before it was decoded, 'key-2' after" in letter["reason"]
    assert await redis.hlen(RECORDS) == 0  # the marker the read left is cleared
    assert await pending(redis, COMMANDS, GROUP) == []


async def test_an_entry_skipped_after_its_read_claimed_it_leaves_no_marker(redis: bus.Redis) -> None:
    events = Bus("shipping")
    seen: list[str] = []

    @events.subscribe(COMMANDS, group=GROUP, messages=[Charge], from_beginning=True)
    async def on_charge(message: Charge) -> None:
        seen.append(message.order)

    worker = Worker(redis, events, config=CONFIG)
    await worker.setup()
    await redis.xadd(COMMANDS.key, raw_entry(type="Refund", id="m-skip"))  # type: ignore[arg-type]
    await publish_charge(redis, "o1")
    await worker.run_until_idle()

    assert seen == ["o1"]
    assert not await dead_letters(redis, COMMANDS)
    assert await redis.hkeys(RECORDS) == [b"saga-o1:charge"]
    assert await pending(redis, COMMANDS, GROUP) == []


async def test_an_entry_with_a_bad_mac_is_dead_lettered_and_leaves_no_marker(redis: bus.Redis) -> None:
    payments = Bus("payments", principal=PAYMENTS)
    handled: list[str] = []

    @payments.handler(COMMANDS, Charge, senders=[ORDERS])
    async def charge(message: Charge, delivery: Delivery) -> None:
        handled.append(message.order)

    worker = Worker(redis, payments, config=CONFIG, auth=auth(keyring(PAYMENTS, ORDERS)))
    await worker.setup()
    signed = bus.Publisher(redis, auth=auth(keyring(ORDERS, PAYMENTS)), principal=ORDERS)
    await signed.publish(COMMANDS, Charge("good", 1), audience=PAYMENTS, idempotency_key="k-good")
    forged = bus.Publisher(
        redis, auth=auth(keyring(ORDERS, PAYMENTS, master={"k1": bytes(32)})), principal=ORDERS
    )
    await forged.publish(COMMANDS, Charge("forged", 1), audience=PAYMENTS, idempotency_key="k-forged")
    await worker.run_until_idle()

    assert handled == ["good"]
    [letter] = await dead_letters(redis, COMMANDS)
    assert letter["reason"].startswith("unauthenticated entry")
    assert await redis.hkeys(RECORDS) == [b"k-good"]  # the forged entry's marker is gone with it
    assert await pending(redis, COMMANDS, GROUP) == []


async def _consumers(redis: bus.Redis) -> tuple[Any, Any]:
    workers = [Worker(redis, payments_app([]), config=CONFIG, consumer=name) for name in ("a", "b")]
    for worker in workers:
        await worker.setup()
    return workers[0].consumers[0].intake, workers[1].consumers[0].intake


async def test_a_wake_up_does_not_spin_on_entries_another_consumer_of_the_group_took(
    redis: bus.Redis,
) -> None:
    a, b = await _consumers(redis)
    assert await a.read_claimed(10, 200) == ([], {})  # the first read does not wait: it learns where to
    for order in ("o1", "o2", "o3"):
        await publish_charge(redis, order)
    entries, _ = await b.read_claimed(10, None)
    assert len(entries) == 3

    reads, start = 0, time.monotonic()
    while time.monotonic() - start < 0.6:
        assert await a.read_claimed(10, 200) == ([], {})
        reads += 1
    assert reads <= 4  # one read woken by b's entries, then each waits its 200 ms


async def test_a_wake_up_returns_when_an_entry_arrives_and_its_read_claims_it(redis: bus.Redis) -> None:
    a, _ = await _consumers(redis)
    await a.read_claimed(10, 200)
    got: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def read() -> None:
            got.append(await a.read_claimed(10, 5_000))

        start = time.monotonic()
        tg.start_soon(read)
        await anyio.sleep(0.1)
        await publish_charge(redis, "o1")
    [(entries, claims)] = got
    assert time.monotonic() - start < 3
    [(entry_id, _, _)] = entries
    assert claims == {entry_id: (None, b"saga-o1:charge")}


async def test_a_read_that_filled_its_batch_reads_again_without_waiting(redis: bus.Redis) -> None:
    a, _ = await _consumers(redis)
    await a.read_claimed(10, 200)
    for order in ("o1", "o2", "o3"):
        await publish_charge(redis, order)
    assert len((await a.read_claimed(2, 5_000))[0]) == 2
    start = time.monotonic()
    assert len((await a.read_claimed(2, 5_000))[0]) == 1  # no wake-up after a full batch
    assert time.monotonic() - start < 2
