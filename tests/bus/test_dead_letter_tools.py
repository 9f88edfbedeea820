"""Dead-letter tools on fakeredis and real Redis: read, filter, requeue (once), refuse, purge."""

from __future__ import annotations

import pytest

import bus
from bus import BusConfig, LetterFilter, Worker
from bus._dead_letters import decode_letter
from tests.bus.test_contract import COMMANDS, CONFIG, payments_app, publish_charge
from tests.helpers import raw_items

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]


async def test_a_requeued_letter_is_handled_again_and_requeue_is_safe_to_repeat(redis: bus.Redis) -> None:
    effects: list[str] = []
    failing = Worker(redis, payments_app(effects, permanent=True), config=CONFIG)
    await failing.setup()
    await publish_charge(redis, "o1")
    await failing.run_until_idle()

    [letter] = await bus.dead_letters(redis, [COMMANDS.dlq_key])
    assert (letter.stream, letter.group, letter.deliveries) == (COMMANDS.key, "payments", 1)
    assert letter.reason == "permanent failure: PermanentError: card declined for o1"
    assert letter.errors == ["PermanentError: card declined for o1"]
    assert (letter.type, letter.correlation_id, letter.idempotency_key) == (
        "Charge",
        "saga-o1",
        "saga-o1:charge",
    )
    assert raw_items(letter.raw)["type"] == "Charge"
    assert letter.requeueable

    [done] = await bus.requeue_dead_letters(redis, [letter])
    assert done.outcome == "requeued"
    assert await bus.requeue_dead_letters(redis, [letter]) == [
        bus.Requeued(letter=letter.id, stream=COMMANDS.key, outcome="gone")
    ]
    assert await bus.dead_letters(redis, [COMMANDS.dlq_key]) == []

    fixed = Worker(redis, payments_app(effects), config=CONFIG)
    await fixed.run_until_idle()
    assert effects == ["o1"]  # the fixed handler ran the requeued entry (a fresh dedupe key: it failed)


async def test_letters_without_a_full_copy_are_refused(redis: bus.Redis) -> None:
    config = BusConfig(max_payload_bytes=1_000, max_entry_bytes=2_000, dlq_field_cap_bytes=100)
    worker = Worker(redis, payments_app([]), config=config)
    await worker.setup()
    await redis.xadd(COMMANDS.key, {"id": "m", "type": "Charge", "at": "1", "v": "1", "data": "x" * 5_000})
    await worker.run_until_idle()
    [cut] = await bus.dead_letters(redis, [COMMANDS.dlq_key])
    assert cut.raw_truncated
    assert not cut.requeueable
    [refused] = await bus.requeue_dead_letters(redis, [cut])
    assert (refused.outcome, refused.why) == ("refused", "the copy of the entry was cut to the size cap")
    assert len(await bus.dead_letters(redis, [COMMANDS.dlq_key])) == 1  # kept

    elsewhere = bus.DeadLetter(dlq=COMMANDS.dlq_key, id=cut.id, stream="rs:{other}:stream")
    [wrong] = await bus.requeue_dead_letters(redis, [elsewhere])
    assert wrong.why == "the stream is not in the dead-letter stream's hash tag"


async def test_filters_and_purge(redis: bus.Redis) -> None:
    worker = Worker(redis, payments_app([], permanent=True), config=CONFIG)
    await worker.setup()
    for order in ("o1", "o2", "o3"):
        await publish_charge(redis, order)
    await redis.xadd(COMMANDS.key, {"junk": "1"})
    await worker.run_until_idle()
    dlq = [COMMANDS.dlq_key]
    assert len(await bus.dead_letters(redis, dlq)) == 4
    assert len(await bus.dead_letters(redis, dlq, limit=2)) == 2
    assert [
        x.correlation_id for x in await bus.dead_letters(redis, dlq, LetterFilter(correlation_id="saga-o2"))
    ] == ["saga-o2"]
    assert len(await bus.dead_letters(redis, dlq, LetterFilter(reason="MISSING ENVELOPE"))) == 1
    assert len(await bus.dead_letters(redis, dlq, LetterFilter(stream="cmd:payments", type="Charge"))) == 3
    assert await bus.dead_letters(redis, dlq, LetterFilter(ids=("not-an-id", "1-1"))) == []
    declined = await bus.dead_letters(redis, dlq, LetterFilter(reason="declined"))
    assert await bus.purge_dead_letters(redis, declined) == 3
    assert await bus.purge_dead_letters(redis, declined) == 0
    assert await bus.dead_letter_sizes(redis, dlq) == {COMMANDS.dlq_key: 1}


def test_a_letter_decodes_whatever_fields_it_has() -> None:
    letter = decode_letter(
        "rs:{t}:dlq",
        "1-0",
        {
            b"stream": b"rs:{t}:s",
            b"errors": b"{}",
            b"deliveries": b"x",
            b"header.step": b"a",
            b"custom": b"\xff",
        },
    )
    assert letter.errors == []
    assert letter.deliveries is None
    assert letter.headers == {"step": "a"}
    assert letter.extra == {"custom": "\ufffd"}
    assert not letter.requeueable
