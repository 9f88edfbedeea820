"""The transport contract: every test runs on fakeredis and on real Redis 7.0."""

from __future__ import annotations

from typing import Final

import anyio
import msgspec
import pytest

import bus
from bus import Bus, BusConfig, Delivery, Publisher, Stream, Worker
from tests.helpers import (
    age_pending,
    dead_letters,
    pending,
    raw_entry,
    raw_items,
    until_redis_clock_passes_newest,
)

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]


class Charge(msgspec.Struct, tag=True):
    order: str
    amount: int


class Charged(msgspec.Struct, tag=True):
    order: str
    receipt: str


COMMANDS = Stream("orders:0", "cmd:payments")
REPLIES = Stream("orders:0", "inbox")
CONFIG = BusConfig(
    lease_ms=10_000, reclaim_interval_ms=1_000, retry_base_ms=100, retry_max_ms=1_000, max_deliveries=3
)


def payments_app(
    effects: list[str], *, fail_times: int = 0, permanent: bool = False, idempotent: bool = True
) -> Bus:
    app = Bus("payments")
    failures = {"left": fail_times}

    @app.handler(COMMANDS, Charge, idempotent=idempotent)
    async def charge(command: Charge, delivery: Delivery) -> Charged:
        if permanent:
            raise bus.PermanentError(f"card declined for {command.order}")
        if failures["left"] > 0:
            failures["left"] -= 1
            raise RuntimeError("gateway timeout")
        effects.append(command.order)
        return Charged(order=command.order, receipt=f"r-{command.order}")

    return app


async def publish_charge(redis: bus.Redis, order: str, *, key: str | None = None) -> str | None:
    return await Publisher(redis, source="orders").publish(
        COMMANDS,
        Charge(order=order, amount=10),
        correlation_id=f"saga-{order}",
        idempotency_key=key or f"saga-{order}:charge",
        reply_to=REPLIES,
    )


RECORDS: Final = COMMANDS.dedupe_key("payments")


async def put_record(redis: bus.Redis, key: str, value: bytes, ttl_ms: int = 60_000) -> None:
    """Keep ``value`` as the payments group's record of ``key``, as the scripts do."""
    seconds, micros = await redis.time()
    await redis.hset(RECORDS, key, value)
    await redis.zadd(COMMANDS.dedupe_expiry_key("payments"), {key: seconds * 1000 + micros // 1000 + ttl_ms})


async def replies(redis: bus.Redis) -> list[bus.Envelope]:
    entries = await redis.xrange(REPLIES.key)
    return [bus.decode_fields(f, max_bytes=1 << 20, max_fields=32) for _, f in entries]


async def test_handler_reply_goes_to_reply_stream_atomically_with_ack(redis: bus.Redis) -> None:
    effects: list[str] = []
    worker = Worker(redis, payments_app(effects), config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    await worker.run_until_idle()

    assert effects == ["o1"]
    [reply] = await replies(redis)
    assert reply.type == "Charged"
    assert reply.decode(Charged) == Charged(order="o1", receipt="r-o1")
    assert reply.correlation_id == "saga-o1"
    assert await pending(redis, COMMANDS, "payments") == []


async def test_publish_is_deduped_by_message_id(redis: bus.Redis) -> None:
    publisher = Publisher(redis)
    first = await publisher.publish(COMMANDS, Charge(order="o1", amount=1), message_id="m-1")
    again = await publisher.publish(COMMANDS, Charge(order="o1", amount=1), message_id="m-1")
    assert first is not None
    assert again is None
    assert await redis.xlen(COMMANDS.key) == 1


async def test_an_id_older_than_the_window_is_published_again_even_before_it_is_trimmed(
    redis: bus.Redis,
) -> None:
    publisher = Publisher(redis)
    other = Stream("orders:1", "cmd:payments")  # another tag: its own dedupe window
    for stream in (COMMANDS, other):
        await redis.zadd(stream.published_key, {"m-old": 1})  # published in 1970, not trimmed yet
    assert await publisher.publish(COMMANDS, Charge(order="o1", amount=1), message_id="m-old") is not None
    envelope = bus.new_envelope(Charge(order="o1", amount=1), max_bytes=1 << 20, message_id="m-old")
    assert await publisher.publish_many([(other, envelope)]) != [None]
    assert await redis.xlen(COMMANDS.key) == await redis.xlen(other.key) == 1
    assert await publisher.publish(COMMANDS, Charge(order="o1", amount=1), message_id="m-old") is None
    assert await publisher.publish_many([(other, envelope)]) == [None]


async def test_publish_many_dedupes_within_a_batch_and_against_earlier_publishes(redis: bus.Redis) -> None:
    publisher = Publisher(redis)
    envelope = bus.new_envelope(Charge(order="o1", amount=1), max_bytes=1 << 20, message_id="m-1")
    assert await publisher.publish_envelope(COMMANDS, envelope) is not None
    others = [
        bus.new_envelope(Charge(order=f"o{i}", amount=i), max_bytes=1 << 20, message_id=f"m-{i}")
        for i in range(2, 5)
    ]
    elsewhere = Stream("orders:1", "cmd:payments")
    items = [(COMMANDS, envelope), (COMMANDS, others[0]), (COMMANDS, others[0]), (elsewhere, others[1])]
    items += [(COMMANDS, others[2])]
    ids = await publisher.publish_many(items)

    assert [entry is not None for entry in ids] == [False, True, False, True, True]
    assert await redis.xlen(COMMANDS.key) == 3  # m-1 (earlier), m-2, m-4
    assert await redis.xlen(elsewhere.key) == 1


async def test_oversized_publish_is_refused_before_writing(redis: bus.Redis) -> None:
    publisher = Publisher(redis, config=BusConfig(max_payload_bytes=100, max_entry_bytes=200))
    with pytest.raises(bus.PayloadTooLarge, match="over the 100-byte limit"):
        await publisher.publish(COMMANDS, Charge(order="x" * 200, amount=1))
    assert await redis.exists(COMMANDS.key) == 0


async def test_redelivered_command_returns_first_result_without_second_effect(redis: bus.Redis) -> None:
    effects: list[str] = []
    worker = Worker(redis, payments_app(effects), config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    await publish_charge(redis, "o1")  # a retry of the same step: same idempotency key, new message
    await worker.run_until_idle()
    # the second copy met the first in flight, so it waits for a redelivery
    [entry] = await pending(redis, COMMANDS, "payments")
    await age_pending(redis, COMMANDS, "payments", str(entry["id"]), CONFIG.lease_ms)
    await worker.run_until_idle()

    assert effects == ["o1"]
    first, second = await replies(redis)
    assert first.payload == second.payload
    assert first.causation_id != second.causation_id  # each reply answers its own command


async def test_transient_failure_is_retried_then_succeeds(redis: bus.Redis) -> None:
    effects: list[str] = []
    worker = Worker(redis, payments_app(effects, fail_times=1), config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    await worker.run_until_idle()
    [entry] = await pending(redis, COMMANDS, "payments")
    assert entry["deliveries"] == 1  # waits for its redelivery delay

    await age_pending(redis, COMMANDS, "payments", str(entry["id"]), CONFIG.lease_ms)
    await worker.run_until_idle()
    assert effects == ["o1"]
    assert await pending(redis, COMMANDS, "payments") == []
    assert await redis.hlen(COMMANDS.failures_key("payments")) == 0


async def test_retry_delay_is_set_on_the_pending_entry(redis: bus.Redis) -> None:
    worker = Worker(redis, payments_app([], fail_times=1), config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    await worker.run_until_idle()
    rows = await redis.xpending_range(COMMANDS.key, "payments", min="-", max="+", count=1)
    idle = rows[0]["time_since_delivered"]
    # idle = lease - delay, delay in [base/2, base]: reclaimable after the delay, not the lease
    assert CONFIG.lease_ms - CONFIG.retry_base_ms <= idle <= CONFIG.lease_ms


async def test_poison_entry_is_dead_lettered_after_the_delivery_limit(redis: bus.Redis) -> None:
    worker = Worker(redis, payments_app([], fail_times=100), config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    for _ in range(CONFIG.max_deliveries):
        await worker.run_until_idle()
        for entry in await pending(redis, COMMANDS, "payments"):
            await age_pending(redis, COMMANDS, "payments", str(entry["id"]), CONFIG.lease_ms)
    await worker.run_until_idle()

    assert await pending(redis, COMMANDS, "payments") == []
    [letter] = await dead_letters(redis, COMMANDS)
    assert letter["reason"] == f"delivery limit of {CONFIG.max_deliveries} reached"
    assert letter["deliveries"] == str(CONFIG.max_deliveries)
    assert letter["stream"] == COMMANDS.key
    assert letter["group"] == "payments"
    assert letter["correlation_id"] == "saga-o1"
    assert letter["attempt"] == "1"
    assert letter["consumer"] == worker.consumer
    assert msgspec.json.decode(letter["errors"]) == ["RuntimeError: gateway timeout"] * CONFIG.max_deliveries
    assert int(letter["first_failed_ms"]) <= int(letter["last_failed_ms"])
    assert raw_items(letter)["type"] == "Charge"
    assert msgspec.json.decode(letter["raw.data"], type=Charge) == Charge(order="o1", amount=10)


async def test_entry_past_the_limit_without_recorded_failures_is_dead_lettered_with_context(
    redis: bus.Redis,
) -> None:
    # a handler that crashes its process on every delivery never records a failure: the
    # delivery count alone tells, and the letter still carries the envelope's context
    effects: list[str] = []
    worker = Worker(redis, payments_app(effects), config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    [[_, [(entry_id, _fields)]]] = await redis.xreadgroup("payments", "crashed", {COMMANDS.key: ">"})
    for _ in range(CONFIG.max_deliveries - 1):  # each crash and takeover is one more delivery
        await redis.xclaim(COMMANDS.key, "payments", "crashed", 0, [entry_id])
    await age_pending(redis, COMMANDS, "payments", entry_id.decode(), CONFIG.lease_ms)
    await worker.run_until_idle()

    assert effects == []
    [letter] = await dead_letters(redis, COMMANDS)
    assert letter["reason"].startswith(f"delivery limit of {CONFIG.max_deliveries} exceeded")
    assert letter["deliveries"] == str(CONFIG.max_deliveries + 1)
    assert letter["correlation_id"] == "saga-o1"
    assert letter["idempotency_key"] == "saga-o1:charge"
    assert letter["type"] == "Charge"
    assert await pending(redis, COMMANDS, "payments") == []


async def test_permanent_failure_is_dead_lettered_at_once(redis: bus.Redis) -> None:
    worker = Worker(redis, payments_app([], permanent=True), config=CONFIG)
    await worker.setup()
    await publish_charge(redis, "o1")
    await worker.run_until_idle()
    [letter] = await dead_letters(redis, COMMANDS)
    assert letter["reason"] == "permanent failure: PermanentError: card declined for o1"
    assert letter["deliveries"] == "1"
    assert await pending(redis, COMMANDS, "payments") == []


DEEP: Final = b"\x91" * 3000 + b"\x90"
"""MessagePack nested 3,000 arrays deep."""


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({b"junk": b"1"}, "missing envelope fields: e, data"),
        ({b"e": raw_entry()[b"e"]}, "missing envelope fields: data"),
        (raw_entry(at="soon"), "invalid envelope field at: Expected `int`, got `str`"),
        (raw_entry(v=9), "unsupported envelope schema version 9"),
        (raw_entry(v=4, extra="an item of a later version"), "unsupported envelope schema version 4"),
        (
            {b"id": b"m", b"type": b"Charge", b"at": b"1", b"v": b"2", b"data": b"{}"},
            "unsupported envelope schema version 2 (its fields are not packed)",
        ),
        (raw_entry(data=b"\xff\xfe"), "malformed payload"),
        (raw_entry(data='{"order": 5}'), "malformed payload"),
        (raw_entry(type="Refund"), "no handler for message type 'Refund'"),
        (raw_entry(id=msgspec.Raw(b"\xa1\xff")), "invalid envelope field: Invalid UTF-8"),
        (raw_entry(id=""), "envelope id and type must not be empty"),
        (raw_entry(hdr=[1]), "invalid envelope field hdr"),
        (raw_entry(hdr={"step": 1}), "invalid envelope field hdr"),
        (raw_entry(mac="a MAC in text"), "invalid envelope field mac"),
        (raw_entry(data='{"order":"o","amount":1}', reply="elsewhere"), "is not a redsaga stream key"),
        ({f"f{i}".encode(): b"x" for i in range(100)}, "entry has 100 fields"),
        (raw_entry(data='{"order":' + "[" * 3000 + "]" * 3000 + "}"), "malformed payload"),
        (raw_entry(hdr=msgspec.Raw(DEEP)), "invalid envelope field hdr"),
        ({**raw_entry(), b"e": b"\x9e\x03" + DEEP}, "invalid envelope field id"),
        ({**raw_entry(), b"e": raw_entry()[b"e"][:-3]}, "invalid envelope field: Input data was truncated"),
        ({**raw_entry(), b"e": b"\xdd\xff\xff\xff\xff\x03"}, "invalid envelope field"),  # 4 billion items
        ({**raw_entry(), b"e": b"\x9e\x03\xdb\xff\xff\xff\xff"}, "invalid envelope field"),  # a 4 GiB id
        ({**raw_entry(), b"e": b"not msgpack"}, "invalid envelope field"),
        ({**raw_entry(), b"e": msgspec.msgpack.encode([3, "m"])}, "invalid envelope field"),
    ],
)
async def test_malformed_entry_is_dead_lettered_on_first_delivery(
    redis: bus.Redis,
    fields: dict[bytes, bytes],
    reason: str,
) -> None:
    effects: list[str] = []
    worker = Worker(redis, payments_app(effects), config=CONFIG)
    await worker.setup()
    entry_id = (await redis.xadd(COMMANDS.key, fields)).decode()  # type: ignore[arg-type]
    await publish_charge(redis, "good")
    await worker.run_until_idle()

    assert effects == ["good"]  # the worker kept going
    [letter] = await dead_letters(redis, COMMANDS)
    assert reason in letter["reason"]
    assert letter["entry"] == entry_id
    assert letter["deliveries"] == "1"
    assert await pending(redis, COMMANDS, "payments") == []


def test_a_payload_nested_too_deeply_to_decode_is_malformed_not_an_error_to_retry() -> None:
    """msgspec gives up on deep nesting with RecursionError; a handler would count it transient."""

    class Anything(msgspec.Struct):
        value: object

    envelope = bus.Envelope(id="m", type="Anything", payload=b'{"value":' + b"[" * 5000 + b"]" * 5000 + b"}")
    with pytest.raises(bus.MalformedEntry, match="nested too deeply"):
        envelope.decode(Anything)


async def test_oversized_entry_is_dead_lettered_without_decoding(redis: bus.Redis) -> None:
    config = BusConfig(max_payload_bytes=1_000, max_entry_bytes=2_000, dlq_field_cap_bytes=100)
    worker = Worker(redis, payments_app([]), config=config)
    await worker.setup()
    await redis.xadd(COMMANDS.key, raw_entry(data="x" * 5_000))  # type: ignore[arg-type]
    await worker.run_until_idle()
    [letter] = await dead_letters(redis, COMMANDS)
    assert "over the 2000-byte limit" in letter["reason"]
    assert letter["raw.data"] == "x" * 100
    assert letter["raw_truncated"] == "1"


async def test_heartbeat_from_a_consumer_that_lost_its_lease_is_refused(redis: bus.Redis) -> None:
    started, release = anyio.Event(), anyio.Event()
    app = Bus("payments")
    effects: list[str] = []

    @app.handler(COMMANDS, Charge)
    async def slow(command: Charge, delivery: Delivery) -> None:
        started.set()
        await release.wait()
        effects.append(delivery.consumer)

    stalled = Worker(redis, app, config=CONFIG, consumer="stalled")
    rescuer = Worker(redis, app, config=CONFIG, consumer="rescuer")
    await stalled.setup()
    await publish_charge(redis, "o1")

    async with anyio.create_task_group() as tg:
        tg.start_soon(stalled.run_until_idle)
        await started.wait()
        [entry] = await pending(redis, COMMANDS, "payments")
        await age_pending(redis, COMMANDS, "payments", str(entry["id"]), CONFIG.lease_ms)
        consumer = stalled.consumers[0]
        delivery = consumer.inflight[str(entry["id"])]
        assert delivery is not None
        # the rescuer takes the entry over; its handler also blocks until released
        started = anyio.Event()
        tg.start_soon(rescuer.run_until_idle)
        await started.wait()
        assert (await pending(redis, COMMANDS, "payments"))[0]["consumer"] == "rescuer"

        with pytest.raises(bus.LeaseLost):
            await delivery.heartbeat()
        assert (await pending(redis, COMMANDS, "payments"))[0]["consumer"] == "rescuer"
        release.set()

    assert effects == ["rescuer"]  # the stalled handler was cancelled when its lease was lost
    assert await pending(redis, COMMANDS, "payments") == []


async def test_a_result_recorded_by_a_consumer_that_lost_its_lease_is_refused(redis: bus.Redis) -> None:
    from bus._outcomes import encode_result, record_call

    await publish_charge(redis, "o1")
    await redis.xgroup_create(COMMANDS.key, "payments", id="0")
    [[_, [(entry_id, fields)]]] = await redis.xreadgroup("payments", "old", {COMMANDS.key: ">"})
    await redis.xclaim(COMMANDS.key, "payments", "new", 0, [entry_id])  # the lease moved on
    envelope = bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32)
    delivery = Delivery(
        envelope=envelope,
        stream=COMMANDS,
        group="payments",
        entry_id=entry_id.decode(),
        deliveries=1,
        consumer="old",
        dedupe_key="k",
    )
    result = encode_result(Charged(order="o1", receipt="late"), CONFIG)
    outcome = await record_call(delivery, result, CONFIG).run(redis)

    assert outcome == b"lost"
    assert (await pending(redis, COMMANDS, "payments"))[0]["consumer"] == "new"
    assert await redis.exists(RECORDS, COMMANDS.dedupe_expiry_key("payments")) == 0


async def test_merged_completion_is_fenced_per_entry(redis: bus.Redis) -> None:
    # one merged completion call: the part whose lease moved on is refused and writes
    # nothing; the others record their result, reply and are acknowledged
    from bus._outcomes import complete_part, encode_result, reply_envelope
    from bus._scripts import merge

    for order in ("o1", "o2", "o3"):
        await publish_charge(redis, order)
    await redis.xgroup_create(COMMANDS.key, "payments", id="0")
    [[_, read]] = await redis.xreadgroup("payments", "old", {COMMANDS.key: ">"})
    moved = read[1][0]
    await redis.xclaim(COMMANDS.key, "payments", "new", 0, [moved])  # o2's lease moved on
    parts = []
    for entry_id, fields in read:
        envelope = bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32)
        delivery = Delivery(
            envelope=envelope,
            stream=COMMANDS,
            group="payments",
            entry_id=entry_id.decode(),
            deliveries=1,
            consumer="old",
            dedupe_key=envelope.idempotency_key,
        )
        order = envelope.decode(Charge).order
        result = encode_result(Charged(order=order, receipt=f"r-{order}"), CONFIG)
        reply = reply_envelope(envelope, result, source="payments", consumer="old", now_ms=1)
        parts.append(complete_part(delivery, result, reply, CONFIG))
    outcomes = await merge(parts).run(redis)

    assert outcomes == [b"done", b"lost", b"done"]
    assert [e["id"] for e in await pending(redis, COMMANDS, "payments")] == [moved.decode()]
    assert await redis.hexists(RECORDS, "saga-o2:charge") == 0
    for order in ("o1", "o3"):  # the record, made of the reply's payload, is the result to the byte
        recorded = await redis.hget(RECORDS, f"saga-{order}:charge")
        assert recorded == encode_result(Charged(order=order, receipt=f"r-{order}"), CONFIG)
    assert sorted(r.decode(Charged).order for r in await replies(redis)) == ["o1", "o3"]
    # a repeat of the call (redis-py re-sends it when its reply is lost) adds nothing: each
    # reply went out with its entry's acknowledgement, so no publish dedupe is kept for it
    assert await merge(parts).run(redis) == [b"lost", b"lost", b"lost"]
    assert len(await replies(redis)) == 2
    sent = [r.id for r in await replies(redis)]
    assert [await redis.zscore(REPLIES.published_key, i) for i in sent] == [None, None]


async def test_merged_completion_answers_duplicate_with_the_first_result(redis: bus.Redis) -> None:
    from bus._outcomes import complete_part, encode_result
    from bus._scripts import merge

    await publish_charge(redis, "o1")
    await redis.xgroup_create(COMMANDS.key, "payments", id="0")
    [[_, [(entry_id, fields)]]] = await redis.xreadgroup("payments", "c", {COMMANDS.key: ">"})
    key = "saga-o1:charge"
    legacy = COMMANDS.legacy_dedupe_key("payments", key)
    first = encode_result(Charged(order="o1", receipt="first"), CONFIG)
    # a concurrent delivery with the same key finished first, on a worker of an earlier
    # release (one key per record): its record is read as a fallback
    await redis.set(legacy, first, ex=60)
    delivery = Delivery(
        envelope=bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32),
        stream=COMMANDS,
        group="payments",
        entry_id=entry_id.decode(),
        deliveries=1,
        consumer="c",
        dedupe_key=key,
    )
    late = encode_result(Charged(order="o1", receipt="second"), CONFIG)
    [outcome] = await merge([complete_part(delivery, late, None, CONFIG)]).run(redis)

    assert outcome == [b"duplicate", first]
    assert await redis.get(legacy) == first
    assert await redis.hexists(RECORDS, key) == 0
    assert len(await pending(redis, COMMANDS, "payments")) == 1  # not acked: completes again


async def test_a_completion_sends_its_reply_payload_once_and_records_it(redis: bus.Redis) -> None:
    """The script records the reply's own payload: a redelivery's reply is the recorded one."""
    from bus._outcomes import complete_part, encode_result, reply_envelope
    from bus._scripts import merge

    await publish_charge(redis, "o1")
    await redis.xgroup_create(COMMANDS.key, "payments", id="0")
    [[_, [(entry_id, fields)]]] = await redis.xreadgroup("payments", "c", {COMMANDS.key: ">"})
    command = bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32)
    key = "saga-o1:charge"
    first = encode_result(Charged(order="o1", receipt="first"), CONFIG)
    await put_record(redis, key, first)  # an earlier delivery recorded it; this one is a redelivery
    delivery = Delivery(
        envelope=command,
        stream=COMMANDS,
        group="payments",
        entry_id=entry_id.decode(),
        deliveries=2,
        consumer="c",
        dedupe_key=key,
    )
    reply = reply_envelope(command, first, source="payments", consumer="c", now_ms=1)
    assert reply is not None
    part = complete_part(delivery, first, reply, CONFIG)
    assert part.args.count(reply.payload) == 1  # the payload goes once: in the reply's fields

    assert await merge([part]).run(redis) == [b"done"]  # the same record: no duplicate
    assert await redis.hget(RECORDS, key) == first
    [sent] = await replies(redis)
    assert (sent.type, sent.decode(Charged)) == ("Charged", Charged(order="o1", receipt="first"))
    assert await pending(redis, COMMANDS, "payments") == []
    other = reply_envelope(
        command,
        encode_result(Charged(order="o1", receipt="other"), CONFIG),
        source="p",
        consumer="c",
        now_ms=1,
    )
    with pytest.raises(ValueError, match="must carry the result it records"):
        complete_part(delivery, first, other, CONFIG)


async def test_subscription_skips_unrouted_types_and_sees_events_from_its_start(redis: bus.Redis) -> None:
    class OrderPlaced(msgspec.Struct, tag=True):
        order: str

    events = Stream.named("orders.events")
    publisher = Publisher(redis, source="orders")
    await publisher.publish(events, OrderPlaced(order="before"))
    seen: dict[str, list[str]] = {"shipping": [], "audit": []}
    app = Bus("shipping")

    @app.subscribe(events, group="shipping", messages=[OrderPlaced])
    async def ship(event: OrderPlaced) -> None:
        seen["shipping"].append(event.order)

    @app.subscribe(events, group="audit", from_beginning=True)
    async def audit(envelope: bus.Envelope) -> None:
        seen["audit"].append(envelope.type)

    worker = Worker(redis, app, config=CONFIG)
    await worker.setup()
    await publisher.publish(events, OrderPlaced(order="after"))
    await publisher.publish(events, Charge(order="x", amount=1))
    await worker.run_until_idle()

    assert seen["shipping"] == ["after"]  # new entries only; Charge skipped
    assert seen["audit"] == ["OrderPlaced", "OrderPlaced", "Charge"]
    assert await dead_letters(redis, events) == []
    for group in ("shipping", "audit"):
        assert await pending(redis, events, group) == []


async def test_follow_up_publish_is_deduped_on_redelivery(redis: bus.Redis) -> None:
    class OrderPlaced(msgspec.Struct, tag=True):
        order: str

    class ShipmentRequested(msgspec.Struct, tag=True):
        order: str

    events, shipping = Stream.named("orders.events"), Stream.named("shipping.events")
    app = Bus("shipping")
    attempts = {"n": 0}

    @app.subscribe(events, group="shipping", messages=[OrderPlaced], from_beginning=True)
    async def ship(event: OrderPlaced, delivery: Delivery) -> None:
        await delivery.publish(shipping, ShipmentRequested(order=event.order))
        attempts["n"] += 1
        if attempts["n"] == 1:
            raise RuntimeError("crash after publishing")

    worker = Worker(redis, app, config=CONFIG)
    await Publisher(redis).publish(events, OrderPlaced(order="o1"))
    await worker.run_until_idle()
    for entry in await pending(redis, events, "shipping"):
        await age_pending(redis, events, "shipping", str(entry["id"]), CONFIG.lease_ms)
    await worker.run_until_idle()

    assert attempts["n"] == 2
    assert await redis.xlen(shipping.key) == 1


async def test_consumer_with_pending_entries_is_never_deleted(redis: bus.Redis) -> None:
    from bus._maintenance import delete_idle_consumers

    app = payments_app([])
    await publish_charge(redis, "o1")
    await redis.xgroup_create(COMMANDS.key, "payments", id="0")
    await redis.xreadgroup("payments", "holder", {COMMANDS.key: ">"})
    await redis.xgroup_createconsumer(COMMANDS.key, "payments", "empty")
    [subscription] = app.subscriptions
    deleted = await delete_idle_consumers(redis, subscription, idle_ms=0, keep="me")
    assert deleted == ["empty"]
    assert [e["consumer"] for e in await pending(redis, COMMANDS, "payments")] == ["holder"]


async def test_trim_never_removes_unacknowledged_entries(redis: bus.Redis) -> None:
    from bus._maintenance import trim_stream

    publisher = Publisher(redis)
    await redis.xgroup_create(COMMANDS.key, "fast", id="0", mkstream=True)
    await redis.xgroup_create(COMMANDS.key, "slow", id="0")
    for i in range(6):
        await publisher.publish(COMMANDS, Charge(order=f"o{i}", amount=i))
    # fast acks everything; slow read 4 and acked 2 (2 pending, 2 never delivered)
    fast = await redis.xreadgroup("fast", "c", {COMMANDS.key: ">"})
    await redis.xack(COMMANDS.key, "fast", *[i for i, _ in fast[0][1]])
    slow = await redis.xreadgroup("slow", "c", {COMMANDS.key: ">"}, count=4)
    slow_ids = [i for i, _ in slow[0][1]]
    await redis.xack(COMMANDS.key, "slow", *slow_ids[:2])

    await until_redis_clock_passes_newest(redis, COMMANDS.key)
    trimmed = await trim_stream(redis, COMMANDS.key, retention_ms=0)
    remaining = [i for i, _ in await redis.xrange(COMMANDS.key)]
    assert remaining[0] == slow_ids[2]  # the oldest entry slow has not acknowledged
    assert len(remaining) + trimmed == 6
    assert trimmed == 2


@pytest.mark.parametrize("retention_ms", [0, None])
async def test_a_maintenance_round_trims_and_deletes_idle_consumers_but_keeps_its_own(
    redis: bus.Redis, retention_ms: int | None
) -> None:
    from bus._maintenance import run_maintenance

    effects: list[str] = []
    app = payments_app(effects)
    worker = Worker(redis, app, config=CONFIG)
    for order in ("o1", "o2"):
        await publish_charge(redis, order)
    await worker.run_until_idle()  # both handled and acknowledged
    await redis.xgroup_createconsumer(COMMANDS.key, "payments", "gone")
    config = BusConfig(retention_ms=retention_ms, consumer_idle_ms=0)
    await until_redis_clock_passes_newest(redis, COMMANDS.key)

    await run_maintenance(redis, app.subscriptions, config, consumer=worker.consumer)

    consumers = {c["name"].decode() for c in await redis.xinfo_consumers(COMMANDS.key, "payments")}
    assert consumers == {worker.consumer}
    assert await redis.xlen(COMMANDS.key) == (0 if retention_ms == 0 else 2)
    assert effects == ["o1", "o2"]


async def test_group_deleted_under_a_worker_is_recreated(redis: bus.Redis, backend: str) -> None:
    if backend == "fake":
        pytest.skip("fakeredis words NOGROUP differently on XREADGROUP (docs/faults.md); real Redis only")
    effects: list[str] = []
    worker = Worker(redis, payments_app(effects), config=BusConfig(block_ms=50, lease_ms=10_000))
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.started.wait()
        await redis.xgroup_destroy(COMMANDS.key, "payments")
        await publish_charge(redis, "o1")
        with anyio.fail_after(10):
            while effects != ["o1"]:
                await anyio.sleep(0.01)  # polling for an observable outcome, not for timing
        worker.stop()
    assert await pending(redis, COMMANDS, "payments") == []


async def test_stream_stats_report_backlog(redis: bus.Redis) -> None:
    await publish_charge(redis, "o1")
    await publish_charge(redis, "o2")
    await redis.xgroup_create(COMMANDS.key, "payments", id="0")
    await redis.xreadgroup("payments", "c", {COMMANDS.key: ">"}, count=1)
    stats = await bus.stream_stats(redis, COMMANDS)
    assert stats.length == 2
    [group] = stats.groups
    assert (group.group, group.pending, group.lag, group.consumers) == ("payments", 1, 1, 1)
    assert group.oldest_pending_age_ms is not None
    assert group.oldest_pending_age_ms >= 0


async def test_graceful_stop_finishes_in_flight_work(redis: bus.Redis) -> None:
    effects: list[str] = []
    gate = anyio.Event()
    app = Bus("payments")

    @app.handler(COMMANDS, Charge)
    async def charge(command: Charge) -> None:
        await gate.wait()
        effects.append(command.order)

    worker = Worker(redis, app, config=BusConfig(block_ms=50))
    for i in range(5):
        await publish_charge(redis, f"o{i}")
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.started.wait()
        with anyio.fail_after(10):
            while len(worker.consumers[0].inflight) < 5:
                await anyio.sleep(0.01)
        worker.stop()
        gate.set()
    assert sorted(effects) == [f"o{i}" for i in range(5)]
    assert await pending(redis, COMMANDS, "payments") == []


async def test_an_idle_stream_does_not_starve_a_busy_one_of_slots(redis: bus.Redis) -> None:
    handled = anyio.Event()
    app = Bus("svc")

    @app.handler(Stream.named("idle"), Charge)
    async def never(command: Charge) -> None:
        raise AssertionError("nothing is published on the idle stream")

    @app.handler(COMMANDS, Charge)
    async def busy(command: Charge) -> None:
        handled.set()

    # one slot per reader at most: the idle reader's blocking read must not hold them all
    worker = Worker(redis, app, config=BusConfig(concurrency=4, block_ms=60_000))
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.started.wait()
        await publish_charge(redis, "o1")
        with anyio.fail_after(10):
            await handled.wait()
        tg.cancel_scope.cancel()


async def test_running_worker_reclaims_an_expired_lease_while_its_reader_blocks(redis: bus.Redis) -> None:
    # the reader of an idle stream holds its slots while it blocks; the reclaimer must still
    # get slots to take over a dead consumer's entry (it starved before slots became fair)
    effects: list[str] = []
    config = BusConfig(block_ms=300, lease_ms=10_000, reclaim_interval_ms=20, concurrency=4)
    worker = Worker(redis, payments_app(effects), config=config)
    await worker.setup()
    await publish_charge(redis, "o1")
    [[_, [(entry_id, _)]]] = await redis.xreadgroup("payments", "dead", {COMMANDS.key: ">"})
    await age_pending(redis, COMMANDS, "payments", entry_id.decode(), config.lease_ms)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(5):
            while effects != ["o1"]:
                await anyio.sleep(0.01)  # polling for an observable outcome, not for timing
        worker.stop()
    assert await pending(redis, COMMANDS, "payments") == []
