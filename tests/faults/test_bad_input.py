"""Bad input (catalogue items 24, 25) and unruly replies (item 22) on real Redis.

Malformed entries, raw-``XADD``ed to a participant's command stream and to a saga inbox
as mutations of a real entry, are dead-lettered on their first delivery with their raw
fields and the reason, while the sagas around them run to their end. Oversized payloads
are refused by every API before anything is written, and a raw 8 MiB field is
dead-lettered without being decoded, by a worker whose memory stays bounded. Duplicate,
late and unmatched replies are recorded in the saga's history and change nothing (G4).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

import bus
import relay
from bus import PayloadTooLarge, Publisher
from redsaga.examples.contracts import Order
from redsaga.examples.orders import order_fulfilment
from saga import SagaStatus
from saga.testing import decode_history
from tests.bus.test_contract import COMMANDS, Charge, publish_charge
from tests.faults.stream_kit import CONFIG, INBOX, INVENTORY, PARTITION, Rig, letters, order
from tests.helpers import dead_letters, envelope_items, raw_entry, repacked
from tests.relay.conftest import OutboxDb, in_thread

# imported here, not in the test: a test module imported mid-test is assertion-rewritten
# from deep in the stack, where CPython 3.11.7's ast.parse fails at random (gh-113035)
from tests.saga.test_waits_redis import PARTITION as LOANS
from tests.saga.test_waits_redis import Approval, waiting

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]
Fields = dict[bytes, bytes]
LIMIT = CONFIG.bus.max_payload_bytes
ROOT = Path(__file__).resolve().parents[2]


def mutate(**changes: bytes | None) -> Callable[[Fields], Fields]:
    """A mutation of an entry's fields (``e``, ``data``): set each given one, drop those given as ``None``."""

    def apply(fields: Fields) -> Fields:
        changed = dict(fields)
        for name, value in changes.items():
            if value is None:
                changed.pop(name.encode(), None)
            else:
                changed[name.encode()] = value
        return changed

    return apply


def repack(**items: object) -> Callable[[Fields], Fields]:
    """A mutation of an entry's packed envelope: set each given item (to any value, of any type)."""
    return lambda fields: repacked(fields, **items)


def many_fields(fields: Fields) -> Fields:
    return {**fields, **{f"x{i}".encode(): b"1" for i in range(10_000)}}


# case -> (mutation, reason on the command stream ('': not a fault there), reason on the inbox
# ('': the command stream's))
CASES: dict[str, tuple[Callable[[Fields], Fields], str, str]] = {
    "missing-fields": (mutate(e=None), "missing envelope fields: e", ""),
    "wrong-type": (repack(at="yesterday"), "invalid envelope field at", ""),
    "bad-json-payload": (
        mutate(data=b'{"order_id": '),
        "payload is not a valid ReserveStock",
        "reply is not a valid StockReserved",
    ),
    "json-headers": (repack(hdr='{"step":"x"}'), "invalid envelope field hdr", ""),
    "invalid-utf8": (repack(corr=msgspec.Raw(b"\xa3\xff\xfe\xfd")), "invalid envelope field", ""),
    "hostile-msgpack": (mutate(e=b"\x9e\x03" + b"\x91" * 10_000 + b"\x90"), "invalid envelope field id", ""),
    "unknown-type": (
        repack(type="Teleport"),
        "no handler for message type 'Teleport'",
        "expects a StockReserved reply, got Teleport",
    ),
    "unknown-saga": (repack(corr="nobody"), "", "no saga 'nobody'"),
    "schema-version": (repack(v=99), "unsupported envelope schema version 99", ""),
    "10000-fields": (many_fields, "entry has 10", ""),  # 10,0xx fields, over the limit of 32
}
# participants do not know saga ids: a command for an unknown saga is valid to them
PARAMS = [
    pytest.param(target, case, reason, id=f"{target}-{case}")
    for case, (_, command_reason, inbox_reason) in CASES.items()
    for target, reason in (("command", command_reason), ("inbox", inbox_reason or command_reason))
    if reason
]


@pytest.mark.parametrize(("target", "case", "reason"), PARAMS)
async def test_malformed_entry_is_dead_lettered_on_first_delivery_and_sagas_flow(
    real_redis: bus.Redis, target: str, case: str, reason: str
) -> None:
    mutation = CASES[case][0]
    stream = INVENTORY if target == "command" else INBOX
    rig = await Rig.create(real_redis)
    await rig.client.start(order_fulfilment, order(1), saga_id="s1")
    if target == "inbox":
        await rig.participants.run_until_idle()  # the real reply to copy
    [(_, real)] = await real_redis.xrange(stream.key)
    bad_id = (await real_redis.xadd(stream.key, mutation(real))).decode()  # type: ignore[arg-type]
    await rig.client.start(order_fulfilment, order(2), saga_id="s2")

    await rig.run()

    [letter] = await letters(real_redis)
    assert (letter["stream"], letter["entry"]) == (stream.key, bad_id)
    assert reason in letter["reason"]
    assert letter["deliveries"] == "1"  # no retry storm
    raw = {k[4:] for k in letter if k.startswith("raw.")}
    assert raw  # the raw copy…
    assert len(raw) <= CONFIG.bus.max_fields  # …capped
    assert letter["raw_truncated"] == ("1" if case == "10000-fields" else "0")
    for saga_id in ("s1", "s2"):  # other traffic flowed (and the copy moved nothing: G4)
        state = await rig.state(saga_id)
        assert state.status == SagaStatus.COMPLETED
        assert [a.outcome for a in state.steps["reserve_stock"].attempts] == ["ok"]
    assert await rig.pending() == 0


async def test_api_calls_over_the_payload_limit_are_refused_before_writing(
    real_redis: bus.Redis, tmp_path: Path
) -> None:
    huge = "x" * (LIMIT + 1)
    with pytest.raises(PayloadTooLarge, match=f"over the {LIMIT}-byte limit") as refused:
        await Publisher(real_redis).publish(COMMANDS, Charge(order=huge, amount=1))
    assert (refused.value.limit, refused.value.size) == (
        LIMIT,
        len(huge) + len('{"type":"Charge","order":"","amount":1}'),
    )

    rig = await Rig.create(real_redis)
    big_order = Order(id="o-big", customer=huge, lines=[], total_cents=1)
    with pytest.raises(PayloadTooLarge, match=f"over the {LIMIT}-byte limit"):
        await rig.client.start(order_fulfilment, big_order, saga_id="big")

    db = OutboxDb("sqlite", f"sqlite:///{tmp_path / 'outbox.db'}", relay.Tables())
    in_thread(relay.init_db, db.dsn, db.tables)
    conn = db.connect()
    with pytest.raises(PayloadTooLarge, match=f"over the {LIMIT}-byte limit"):
        relay.Outbox(db.tables).add(conn, "payments", Charge(order=huge, amount=1))
    conn.commit()
    assert db.query("SELECT count(*) FROM {outbox}") == [(0,)]

    assert await real_redis.xlen(COMMANDS.key) == 0
    assert await real_redis.xlen(INVENTORY.key) == 0
    assert not await real_redis.exists(PARTITION.saga("big"), PARTITION.history("big"))


async def test_a_signal_over_the_payload_limit_is_refused_before_writing(real_redis: bus.Redis) -> None:
    world, saga_id = await waiting(real_redis)
    before = await real_redis.xlen(LOANS.inbox.key)
    with pytest.raises(PayloadTooLarge, match=f"over the {LIMIT}-byte limit"):
        await world.client.signal(world.tokens[0], Approval(approved=True, by="x" * LIMIT))
    assert await real_redis.xlen(LOANS.inbox.key) == before
    assert (await world.client.get(saga_id)).status == SagaStatus.SUSPENDED


async def test_raw_8_mib_fields_are_dead_lettered_undecoded_and_worker_memory_stays_bounded(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    entries, concurrency, size = 6, 2, 8 << 20
    await real_redis.xgroup_create(COMMANDS.key, "payments", id="0", mkstream=True)
    await publish_charge(real_redis, "before")
    for n in range(entries):
        # not even JSON: decoding it would fail too, but it must not be tried
        await real_redis.xadd(COMMANDS.key, raw_entry(id=f"big-{n}", data=b"{" * size))  # type: ignore[arg-type]
    await publish_charge(real_redis, "after")

    done = subprocess.run(
        [sys.executable, "-m", "tests.faults.bulk_worker", real_redis_url, str(concurrency)],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        check=True,
    )
    report = json.loads(done.stdout.splitlines()[-1])

    assert sorted(report["effects"]) == ["after", "before"]  # other traffic flowed
    big = await dead_letters(real_redis, COMMANDS)
    assert len(big) == entries
    for letter in big:
        assert f"over the {CONFIG.bus.max_entry_bytes}-byte limit" in letter["reason"]  # judged by size
        assert letter["deliveries"] == "1"
        assert len(letter["raw.data"]) == CONFIG.bus.dlq_field_cap_bytes  # the copy is capped
        assert letter["raw_truncated"] == "1"
    assert sum(len(v) for _, f in await real_redis.xrange(COMMANDS.dlq_key) for v in f.values()) < entries * (
        CONFIG.bus.dlq_field_cap_bytes + 4096
    )
    # a worker reads at most ``concurrency`` entries at once: 2 x 8 MiB, plus the reply's
    # copies; generously bounded far below the 48 MiB the six entries weigh together
    growth_mib = (report["peak_kib"] - report["before_kib"]) / 1024
    assert growth_mib < 42, f"the worker grew by {growth_mib:.0f} MiB"


async def replies_of(rig: Rig) -> list[Fields]:
    """The inbox entries that are step replies (they name the command they answer)."""
    return [f for _, f in await rig.redis.xrange(INBOX.key) if (i := envelope_items(f))["cause"] and i["hdr"]]


async def test_duplicate_late_and_unmatched_replies_are_recorded_and_change_nothing(
    real_redis: bus.Redis,
) -> None:
    rig = await Rig.create(real_redis)
    await rig.client.start(order_fulfilment, order(1), saga_id="s1")
    [(attempt_1, _)] = await real_redis.xrange(INVENTORY.key)
    await real_redis.xdel(INVENTORY.key, attempt_1)  # attempt 1 is never answered in time
    await rig.run()
    await rig.time_out_and_retry()
    done = await rig.state("s1")
    assert done.status == SagaStatus.COMPLETED
    reserve = done.steps["reserve_stock"]
    assert [(a.n, a.outcome) for a in reserve.attempts] == [(1, "timeout"), (2, "ok")]
    history_before = len(await rig.history("s1"))

    replies = await replies_of(rig)
    # attempt 1's reply, arriving after attempt 2 succeeded
    late = repacked(replies[0], cause=reserve.attempts[0].command_id, n=1, id="late-1")
    unknown_step = repacked(
        replies[0], id="odd-1", hdr={"step": "no_such_step", "kind": "do", "inc": str(done.created_ms)}
    )
    out_of_order = repacked(
        replies[-1], id="ooo-1", hdr={"step": "charge_payment", "kind": "undo", "inc": str(done.created_ms)}
    )
    sent = [*replies, *replies, late, unknown_step, out_of_order]  # every reply twice more
    for fields in sent:
        await real_redis.xadd(INBOX.key, fields)  # type: ignore[arg-type]
    await rig.run()

    after = await rig.state("s1")
    assert after.revision == done.revision  # G4: nothing moved
    assert msgspec.json.encode(after) == msgspec.json.encode(done)
    history = await rig.history("s1")
    assert len(history) == history_before + len(sent)  # each one recorded
    assert all(entry.ignored for entry in decode_history(history, state=after)[history_before:])
    assert await letters(real_redis) == []
    assert await rig.pending() == 0
