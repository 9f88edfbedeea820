"""What a stolen participant's Redis user can make the engine keep as dedupe records, on a real
``redis-server`` with the example's generated ACL users and keyrings.

Its user once made any number of ``rs:{orders:<n>}:dedupe:payments:*`` keys (5,000 in the
incident; millions were as cheap). The records are two keys per partition now, named whole
by its ACL pattern: it makes no other key. It can still add fields to its hash (its claim
script does, under its user: Redis 7.0 checks a function's commands against the caller's
ACL); the orchestrator exports the hash's size, which the engine keeps at most
``BusConfig.dedupe_quota``, and the participant's worker adds no record past the quota.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bus import BusConfig
from bus._outcomes import DEDUPE_OVER_QUOTA
from saga import SagaStatus, SagaWorker
from saga.metrics import WorkerMetrics
from tests.metrics.scrape import parse, value
from tests.security.test_acl import STATELESS
from tests.security.test_attacks import ORDERS, World, refused, world

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
__all__ = ["world"]
QUOTA = 10
FLOOD = 5_000
PAYMENTS = ORDERS.commands("payments")
RECORDS = PAYMENTS.dedupe_key("payments")
EXPIRY = PAYMENTS.dedupe_expiry_key("payments")


def _bounded(world: World) -> SagaWorker:
    """The payments worker again, with a quota small enough to reach in a test."""
    config = world.users.config("participant:payments")
    config = replace(config, bus=BusConfig(lease_ms=5_000, dedupe_quota=QUOTA))
    redis = world.users.client("redsaga.orders.payments")
    bounded = SagaWorker(redis, STATELESS["redsaga.orders.payments"], config=config, consumer="bounded")
    world.workers["redsaga.orders.payments"] = bounded
    return bounded


async def test_the_participant_makes_no_dedupe_key_beyond_its_two_per_partition(world: World) -> None:
    made = [
        PAYMENTS.legacy_dedupe_key("payments", "junk-1"),  # one key per record, as before
        "rs:{orders:0}:dedupe:payments:x:y",
        "rs:{orders:0}:dedupe:payments2",
        "rs:{orders:0}:dedupe-expiry:payments2",
    ]
    for key in made:
        await refused(world.redis.set(key, "x"))
    await refused(world.redis.set(RECORDS, "x"))  # its hash: no SET, no string of its own
    await refused(world.redis.hset(PAYMENTS.dedupe_key("inventory"), "k", "R"))  # nor another's
    assert [k for k in made if await world.users.admin.exists(k)] == []


async def test_records_written_past_the_engine_are_exported_and_the_engine_adds_none(world: World) -> None:
    payments = _bounded(world)
    # as its worker does when it starts (``SagaWorker.run``): the orchestrator's metrics find it
    await payments.versions.register_participant("orders", "payments", by="payments/bounded")
    metrics = WorkerMetrics(world.workers["redsaga.orders"])
    async with world.redis.pipeline(transaction=False) as pipe:  # the stolen user, past the engine
        for n in range(FLOOD):
            pipe.hset(RECORDS, f"junk-{n}", "R")
        await pipe.execute()

    samples = parse((await metrics.exposition()).decode())
    found = value(samples, "redsaga_dedupe_records", context="orders", participant="payments", partition="0")
    assert found == FLOOD  # above any quota: the alert's expression holds
    # the honest worker adds no record past the quota: the charge waits, counted
    await world.step("redsaga.orders.inventory", "redsaga.orders", "redsaga.orders.payments")
    assert payments.bus_worker.incidents[DEDUPE_OVER_QUOTA] == 1
    assert await world.users.admin.hlen(RECORDS) == FLOOD
    [held] = await world.users.admin.xpending_range(PAYMENTS.key, "payments", "-", "+", 10)
    failures = await world.users.admin.hget(PAYMENTS.failures_key("payments"), held["message_id"])
    assert b"the group holds its quota of 10 dedupe records" in failures
    assert (await world.state()).status == SagaStatus.RUNNING

    # the response (docs/security.md): the user revoked, an admin deletes the two keys; the
    # retry (made due here rather than waited for) runs the charge once
    await world.users.admin.delete(RECORDS, EXPIRY)
    await world.users.admin.xclaim(PAYMENTS.key, "payments", "bounded", 0, [held["message_id"]], idle=5_000)
    await world.settle()
    assert (await world.state()).status == SagaStatus.COMPLETED
    assert await world.users.admin.hlen(RECORDS) == 1  # the charge's first result
    samples = parse((await metrics.exposition()).decode())
    assert value(samples, "redsaga_dedupe_records", participant="payments") == 1
