"""An idempotent group's dedupe records: two keys per tag, expiring, pruned, bounded by a quota,
and the records of earlier releases (one key each) read as a fallback. On fakeredis and on
real Redis 7.0 (and the cluster)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import bus
from bus import Worker
from bus._outcomes import DEDUPE_OVER_QUOTA, encode_result
from tests.bus.test_contract import (
    COMMANDS,
    CONFIG,
    RECORDS,
    Charged,
    payments_app,
    publish_charge,
    put_record,
    replies,
)
from tests.helpers import pending

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
EXPIRY = COMMANDS.dedupe_expiry_key("payments")


async def _run(redis: bus.Redis, effects: list[str], config: bus.BusConfig = CONFIG) -> Worker:
    worker = Worker(redis, payments_app(effects), config=config)
    await worker.setup()
    await worker.run_until_idle()
    return worker


async def test_a_group_keeps_its_records_in_two_keys_that_expire_with_them(redis: bus.Redis) -> None:
    for order in ("o1", "o2", "o3"):
        await publish_charge(redis, order)
    await _run(redis, effects := [])

    assert effects == ["o1", "o2", "o3"]
    keys = ("saga-o1:charge", "saga-o2:charge", "saga-o3:charge")
    assert await redis.exists(RECORDS, EXPIRY) == 2
    assert await redis.exists(*(COMMANDS.legacy_dedupe_key("payments", k) for k in keys)) == 0
    assert await redis.hlen(RECORDS) == 3
    now_s, _ = await redis.time()
    for key in keys:
        due = await redis.zscore(EXPIRY, key)
        assert abs(due - (now_s + CONFIG.dedupe_ttl_s) * 1000) < 60_000  # its first result, a day
    for key in (RECORDS, EXPIRY):  # gone once every record in them is
        assert 0 < await redis.pttl(key) <= CONFIG.dedupe_ttl_s * 1000


async def test_an_expired_record_is_no_record_and_claims_prune_expired_ones(redis: bus.Redis) -> None:
    first = encode_result(Charged(order="o1", receipt="old"), CONFIG)
    # expired, not yet pruned; due times a millisecond apart, so "oldest" does not depend on
    # how many of these writes land in the same millisecond (ties go in name order)
    await put_record(redis, "saga-o1:charge", first, ttl_ms=-10)
    for n in range(4):
        await put_record(redis, f"gone-{n}", b"R", ttl_ms=n - 9)
    await publish_charge(redis, "o1")
    await _run(redis, effects := [])

    assert effects == ["o1"]  # ran again, as after a record's TTL
    [reply] = await replies(redis)
    assert reply.decode(Charged).receipt == "r-o1"
    # one entry claimed prunes up to 2 + 2 expired records, oldest first
    assert sorted(await redis.hkeys(RECORDS)) == [b"gone-3", b"saga-o1:charge"]
    assert await redis.zcard(EXPIRY) == 2


async def test_a_delivery_turned_away_leaves_the_marker_of_the_one_in_flight(redis: bus.Redis) -> None:
    holder = "1-1|another-consumer"  # a first delivery of the key, its handler still running
    await put_record(redis, "saga-o1:charge", b"I" + holder.encode())
    await publish_charge(redis, "o1")  # a second delivery of the same key
    await _run(redis, effects := [])

    assert effects == []
    assert len(await pending(redis, COMMANDS, "payments")) == 1  # it waits for a redelivery
    # and the first keeps its claim: a third delivery would be turned away as well
    assert await redis.hget(RECORDS, "saga-o1:charge") == b"I" + holder.encode()


async def test_a_group_adds_no_record_past_its_quota_the_delivery_waits(redis: bus.Redis) -> None:
    config = replace(CONFIG, dedupe_quota=2)
    for order in ("o1", "o2"):
        await publish_charge(redis, order)
    await _run(redis, effects := [], config)
    await publish_charge(redis, "o3")
    worker = await _run(redis, effects, config)

    assert effects == ["o1", "o2"]
    assert await redis.hlen(RECORDS) == 2
    assert worker.incidents[DEDUPE_OVER_QUOTA] == 1
    [held] = await pending(redis, COMMANDS, "payments")  # retried once records expire
    history = await redis.hget(COMMANDS.failures_key("payments"), held["id"])
    assert b"the group holds its quota of 2 dedupe records (BusConfig.dedupe_quota)" in history
    await publish_charge(redis, "o1")  # a key it holds is answered, quota or not
    await _run(redis, effects, config)
    assert effects == ["o1", "o2"]


async def test_a_record_an_earlier_release_kept_is_answered_not_run_again(redis: bus.Redis) -> None:
    """A rolling upgrade: a worker of the earlier release recorded the first result as one key."""
    first = encode_result(Charged(order="o1", receipt="before the upgrade"), CONFIG)
    await redis.set(COMMANDS.legacy_dedupe_key("payments", "saga-o1:charge"), first, ex=60)
    await publish_charge(redis, "o1")
    await _run(redis, effects := [])

    assert effects == []
    [reply] = await replies(redis)
    assert reply.decode(Charged).receipt == "before the upgrade"
    assert await redis.hget(RECORDS, "saga-o1:charge") == first  # answered, then recorded anew
