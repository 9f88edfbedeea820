"""Signed entries: keys, the MAC over an entry's fields, and what a consumer does with each
entry it cannot authenticate (dead letter in ``require`` mode, report in ``log`` mode)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import anyio
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bus
from bus import Authenticator, AuthError, Bus, Delivery, Keyring, Stream, Unauthenticated, Worker
from bus._auth import decode_keyrings, encode_keyrings, issue, load_keyrings, stream_audience
from tests.helpers import as_fields, dead_letters, envelope_items, eventually, repacked

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
MASTER = {"k1": os.urandom(32)}
ORDERS, PAYMENTS, INVENTORY = "orchestrator:orders", "participant:payments", "participant:inventory"


class Charge(msgspec.Struct, tag=True):
    order: str
    amount: int


class Charged(msgspec.Struct, tag=True):
    order: str


def keyring(who: str, *sends_to: str, master: dict[str, bytes] = MASTER) -> Keyring:
    return issue(master, who, sends_to=sends_to)


def auth(*keyrings: Keyring, mode: bus._auth.Mode | None = None) -> Authenticator:
    return Authenticator(keyrings, mode)


def decoded(fields: dict[bytes, bytes]) -> bus.Envelope:
    """``fields`` as a consumer decodes them before it checks the MAC."""
    return bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32)


def read_back(envelope: bus.Envelope) -> bus.Envelope:
    """``envelope`` written and read back."""
    return decoded(as_fields(envelope))


def command(**overrides: object) -> bus.Envelope:
    """A command envelope with every optional field set."""
    options: dict[str, object] = {
        "correlation_id": "saga-1",
        "idempotency_key": "saga-1:charge:do",
        "reply_to": "rs:{orders:0}:inbox",
        "headers": {"step": "charge", "kind": "do"},
        "attempt": 2,
    }
    options.update(overrides)
    return bus.new_envelope(Charge("o1", 100), max_bytes=1 << 20, source="orders", **options)  # type: ignore[arg-type]


def test_a_signed_entry_verifies_for_its_audience_and_names_its_signer() -> None:
    orchestrator, payments = auth(keyring(ORDERS, PAYMENTS)), auth(keyring(PAYMENTS, ORDERS))
    signed = orchestrator.sign(command(), PAYMENTS, ORDERS)
    assert (signed.signer, signed.key_id, len(signed.mac)) == (ORDERS, "k1", 16)
    assert payments.verify(read_back(signed), PAYMENTS, PAYMENTS) == ORDERS


@pytest.mark.parametrize(
    ("item", "value"),
    [("id", "m2"), ("src", "billing"), ("corr", "saga-2"), ("cause", "c2"), ("idem", "saga-1:charge:undo"),
     ("n", 3), ("hdr", {"step": "refund", "kind": "do"}), ("type", "Refund"), ("p", PAYMENTS), ("k", "k2"),
     ("reply", "rs:{orders:1}:inbox"), ("mac", b"A" * 16)],
)  # fmt: skip
def test_changing_any_signed_item_breaks_the_mac(item: str, value: object) -> None:
    orchestrator, payments = auth(keyring(ORDERS, PAYMENTS)), auth(keyring(PAYMENTS, ORDERS))
    fields = repacked(as_fields(orchestrator.sign(command(), PAYMENTS, ORDERS)), **{item: value})
    with pytest.raises(Unauthenticated):
        payments.verify(decoded(fields), PAYMENTS, PAYMENTS)


def test_changing_the_payload_breaks_the_mac() -> None:
    orchestrator, payments = auth(keyring(ORDERS, PAYMENTS)), auth(keyring(PAYMENTS, ORDERS))
    fields = as_fields(orchestrator.sign(command(), PAYMENTS, ORDERS))
    fields[b"data"] = b'{"type":"Charge","order":"o1","amount":1}'
    with pytest.raises(Unauthenticated):
        payments.verify(decoded(fields), PAYMENTS, PAYMENTS)


def test_header_order_and_how_items_are_packed_are_not_signed() -> None:
    """The MAC covers the message as decoded, not the bytes one writer happened to produce."""
    orchestrator, payments = auth(keyring(ORDERS, PAYMENTS)), auth(keyring(PAYMENTS, ORDERS))
    fields = as_fields(orchestrator.sign(command(attempt=1), PAYMENTS, ORDERS))
    items = envelope_items(fields)
    items["hdr"] = {"kind": "do", "step": "charge"}
    assert list(items["hdr"]) != list(command().headers)
    first_nine = msgspec.msgpack.encode(list(items.values())[:9])[1:]  # without their array's header
    wide_one = b"\xcf" + (1).to_bytes(8, "big")  # the attempt as a uint64, as Redis's cmsgpack packs ints
    rest = b"".join(msgspec.msgpack.encode(items[name]) for name in ("hdr", "p", "k", "mac"))
    fields[b"e"] = b"\x9e" + first_nine + wide_one + rest
    assert envelope_items(fields) == items
    assert payments.verify(decoded(fields), PAYMENTS, PAYMENTS) == ORDERS


def test_an_idempotency_key_equal_to_the_id_is_left_out_and_still_covered() -> None:
    """A reply is deduped on its id: ``idem`` would repeat it, so it is left empty."""
    orchestrator, payments = auth(keyring(ORDERS, PAYMENTS)), auth(keyring(PAYMENTS, ORDERS))
    reply = command(message_id="r1", idempotency_key="r1")
    fields = as_fields(payments.sign(reply, ORDERS, PAYMENTS))
    assert envelope_items(fields)["idem"] == ""
    read = decoded(fields)
    assert (read.dedupe_key, orchestrator.verify(read, ORDERS, ORDERS)) == ("r1", PAYMENTS)
    assert orchestrator.verify(decoded(repacked(fields, idem="r1")), ORDERS, ORDERS) == PAYMENTS
    with pytest.raises(Unauthenticated):
        orchestrator.verify(decoded(repacked(fields, idem="saga-1:charge:do")), ORDERS, ORDERS)


def test_at_is_not_covered_a_timer_is_stamped_when_it_fires() -> None:
    orchestrator = auth(keyring(ORDERS))
    fields = as_fields(orchestrator.sign(command(), ORDERS, ORDERS))
    assert orchestrator.verify(decoded(repacked(fields, at=1)), ORDERS, ORDERS) == ORDERS


def test_a_key_a_participant_checks_commands_with_signs_nothing_it_could_use() -> None:
    """The participant derives K(orders -> payments): it proves only messages *to* payments."""
    payments = auth(keyring(PAYMENTS, ORDERS))
    orchestrator = auth(keyring(ORDERS, PAYMENTS, INVENTORY))
    forged = payments.sign(command(), ORDERS, PAYMENTS)  # a reply, signed as itself: fine
    assert orchestrator.verify(read_back(forged), ORDERS, ORDERS) == PAYMENTS
    fake = msgspec.structs.replace(forged, signer=ORDERS)  # claims to be the orchestrator
    with pytest.raises(Unauthenticated, match="MAC does not verify"):
        orchestrator.verify(read_back(fake), ORDERS, ORDERS)
    inventory = auth(keyring(INVENTORY, ORDERS))
    with pytest.raises(Unauthenticated, match="MAC does not verify"):  # nor a command to inventory
        inventory.verify(read_back(payments.sign(command(), PAYMENTS, PAYMENTS)), INVENTORY, INVENTORY)


def test_unsigned_unknown_key_and_wrong_sender_are_refused_with_their_reason() -> None:
    orchestrator = auth(keyring(ORDERS, PAYMENTS))
    payments = auth(keyring(PAYMENTS, ORDERS))
    with pytest.raises(Unauthenticated, match="not signed"):
        payments.verify(read_back(command()), PAYMENTS, PAYMENTS)
    rotated = auth(keyring(ORDERS, PAYMENTS, master={"k9": os.urandom(32)}))
    with pytest.raises(Unauthenticated, match="key id 'k9'"):
        payments.verify(read_back(rotated.sign(command(), PAYMENTS, ORDERS)), PAYMENTS, PAYMENTS)
    signed = as_fields(orchestrator.sign(command(), PAYMENTS, ORDERS))
    with pytest.raises(Unauthenticated, match="may not write here"):
        payments.verify(decoded(signed), PAYMENTS, PAYMENTS, senders=frozenset({"orchestrator:billing"}))
    with pytest.raises(Unauthenticated, match="invalid signer"):
        payments.verify(decoded(repacked(signed, p="no such role")), PAYMENTS, PAYMENTS)


def test_several_key_ids_verify_the_newest_signs() -> None:
    old, new = os.urandom(32), os.urandom(32)
    both = {"k1": old, "k2": new}
    orchestrator_before = auth(keyring(ORDERS, PAYMENTS, master={"k1": old}))
    orchestrator_after = auth(keyring(ORDERS, PAYMENTS, master=both))
    payments = auth(keyring(PAYMENTS, ORDERS, master=both))
    assert orchestrator_after.sign(command(), PAYMENTS, ORDERS).key_id == "k2"
    for signer in (orchestrator_before, orchestrator_after):
        assert (
            payments.verify(read_back(signer.sign(command(), PAYMENTS, ORDERS)), PAYMENTS, PAYMENTS) == ORDERS
        )
    sign_old = issue(both, ORDERS, sends_to=[PAYMENTS], sign_with="k1")
    assert auth(sign_old).sign(command(), PAYMENTS, ORDERS).key_id == "k1"


def test_a_broadcast_streams_subscribers_share_its_root() -> None:
    events = stream_audience("rs:{orders.events}:stream")
    publisher = auth(issue(MASTER, "service:orders", sends_to=[events]))
    subscriber = auth(issue(MASTER, "service:shipping", sends_to=[], streams=["rs:{orders.events}:stream"]))
    signed = publisher.sign(command(), events, "service:orders")
    assert subscriber.verify(read_back(signed), events, "service:shipping") == "service:orders"
    stranger = auth(issue(MASTER, "service:billing", sends_to=[]))
    with pytest.raises(Unauthenticated, match="does not hold"):
        stranger.verify(read_back(signed), events, "service:billing")


def test_keyrings_round_trip_and_never_show_their_secrets(tmp_path: object) -> None:
    rings = [keyring(ORDERS, PAYMENTS), keyring(PAYMENTS, ORDERS)]
    raw = encode_keyrings(rings)
    assert decode_keyrings(raw) == rings
    assert load_keyrings(raw.decode()) == rings
    text = repr(rings) + repr(auth(*rings))
    for ring in rings:
        for key_set in ring.sets:
            assert key_set.receive.hex() not in text
    with pytest.raises(AuthError, match="not valid"):
        decode_keyrings(b'{"redsaga_keyring": 1, "principals": {"x": 1}}')
    with pytest.raises(AuthError, match="unsupported keyring format 2"):
        decode_keyrings(b'{"redsaga_keyring": 2, "principals": {}}')
    with pytest.raises(AuthError, match="cannot read the keyring"):
        load_keyrings("/nonexistent/keyring.json")


def test_configuration_mistakes_are_named() -> None:
    with pytest.raises(AuthError, match="needs a keyring"):
        Authenticator((), "require")
    with pytest.raises(AuthError, match="unknown verification mode"):
        Authenticator([keyring(ORDERS)], "sometimes")  # type: ignore[arg-type]
    with pytest.raises(AuthError, match="no key for sending to participant:shipping"):
        auth(keyring(ORDERS, PAYMENTS)).sign(command(), "participant:shipping", ORDERS)
    with pytest.raises(AuthError, match="acts as participant:payments but its keyring holds only"):
        auth(keyring(ORDERS)).sign(command(), ORDERS, PAYMENTS)
    with pytest.raises(AuthError, match="REDSAGA_VERIFY='maybe'"):
        Authenticator.from_env({"REDSAGA_VERIFY": "maybe"})
    assert not Authenticator.from_env({}).enabled


@given(
    st.text(min_size=1, max_size=40),
    st.binary(max_size=300),
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    st.integers(min_value=1, max_value=1000),
    st.text(max_size=30),
)
def test_what_is_signed_is_what_is_read_back(
    correlation: str, payload: bytes, headers: dict[str, str], attempt: int, cause: str
) -> None:
    """The canonical bytes made from an envelope equal those made from it read back."""
    orchestrator = auth(keyring(ORDERS))
    envelope = bus.Envelope(
        id="e1", type="T", payload=payload, correlation_id=correlation, causation_id=cause,
        headers=headers, attempt=attempt,
    )  # fmt: skip
    assert (
        orchestrator.verify(read_back(orchestrator.sign(envelope, ORDERS, ORDERS)), ORDERS, ORDERS) == ORDERS
    )


# -- a consumer with signing on ---------------------------------------------------------------

STREAM = Stream("orders:0", "cmd:payments")
INBOX = Stream("orders:0", "inbox")


@pytest.fixture
async def fake() -> AsyncIterator[bus.Redis]:
    client = bus.connect(bus.MEMORY_URL)
    try:
        yield client
    finally:
        await client.aclose()


async def _serve(
    redis: bus.Redis, mode: bus._auth.Mode, handled: list[tuple[Charge, str]]
) -> tuple[Worker, Authenticator]:
    payments = Bus("payments", principal=PAYMENTS)

    @payments.handler(STREAM, Charge, senders=[ORDERS])
    async def charge(message: Charge, delivery: Delivery) -> Charged:
        handled.append((message, delivery.principal))
        return Charged(message.order)

    worker_auth = auth(keyring(PAYMENTS, ORDERS), mode=mode)
    return Worker(redis, payments, auth=worker_auth, consumer="c1"), worker_auth


@pytest.mark.parametrize("mode", ["require", "log"])
async def test_a_consumer_handles_signed_entries_and_dead_letters_or_reports_the_rest(
    fake: bus.Redis, mode: bus._auth.Mode
) -> None:
    handled: list[tuple[Charge, str]] = []
    worker, _ = await _serve(fake, mode, handled)
    orchestrator = bus.Publisher(fake, auth=auth(keyring(ORDERS, PAYMENTS)), principal=ORDERS)
    inventory = bus.Publisher(fake, auth=auth(keyring(INVENTORY, PAYMENTS)), principal=INVENTORY)
    unsigned = bus.Publisher(fake)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.started.wait()
        await orchestrator.publish(
            STREAM, Charge("good", 1), audience=PAYMENTS, reply_to=INBOX, correlation_id="good"
        )
        await inventory.publish(STREAM, Charge("wrong-sender", 2), audience=PAYMENTS, reply_to=INBOX)
        await unsigned.publish(STREAM, Charge("unsigned", 3), reply_to=INBOX)
        if mode == "require":
            await eventually(lambda: len(handled) == 1, 10, "the signed command is handled")
            await eventually(lambda: _letters(fake, 2), 10, "two dead letters")
            reasons = sorted(letter["reason"] for letter in await dead_letters(fake, STREAM))
            assert reasons == [
                "unauthenticated entry: entry is not signed (no signer, key id or MAC)",
                (
                    "unauthenticated entry: signed by participant:inventory, which may not write here "
                    "(only orchestrator:orders)"
                ),
            ]
            assert handled == [(Charge("good", 1), ORDERS)]
        else:
            await eventually(lambda: len(handled) == 3, 10, "every command is handled")
            assert worker.incidents["unauthenticated"] == 2
            assert not await dead_letters(fake, STREAM)
        await eventually(lambda: _replies(fake), 10, "the signed command's reply")
        worker.stop()
    [reply] = [f for _, f in await fake.xrange(INBOX.key) if envelope_items(f)["corr"] == "good"]
    orchestrator_auth = auth(keyring(ORDERS, PAYMENTS))
    assert orchestrator_auth.verify(decoded(reply), ORDERS, ORDERS) == PAYMENTS  # signed for whoever sent it


async def _replies(redis: bus.Redis) -> bool:
    return bool(await redis.xlen(INBOX.key))


async def _letters(redis: bus.Redis, n: int) -> bool:
    return len(await dead_letters(redis, STREAM)) >= n


async def test_a_worker_refuses_to_start_without_the_keyring_its_handlers_act_as(fake: bus.Redis) -> None:
    payments = Bus("payments", principal=PAYMENTS)

    @payments.handler(STREAM, Charge)
    async def charge(message: Charge) -> None: ...

    with pytest.raises(AuthError, match="acts as participant:payments"):
        Worker(fake, payments, auth=auth(keyring(ORDERS)))
