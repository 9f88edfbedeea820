"""What one principal can make the engine store, on a real ``redis-server`` with the example's
generated ACL users and keyrings: a flood of the inbox from a stolen participant's user and
keyring leaves, per window, at most the quota of dead letters for that principal (and for
entries no signature vouches for), one letter that says the quota was reached, a count in
Redis of the rest, and the ``letters_over_quota`` incident the alert watches.
"""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from bus import BusConfig
from bus._consumer import LETTERS_OVER_QUOTA, UNVERIFIED
from saga import SagaStatus, SagaWorker
from saga.runtime.protocol import CANCEL, OperatorRequest
from tests.helpers import dead_letters
from tests.security.test_acl import STATELESS
from tests.security.test_attacks import ORDERS, World, world

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
__all__ = ["world"]
QUOTA = 10
FLOOD = 60


def _bounded(world: World) -> SagaWorker:
    """The orchestrator again, with a quota small enough to reach in a test."""
    config = world.users.config("orchestrator:orders")
    config = replace(config, bus=BusConfig(lease_ms=5_000, letter_quota=QUOTA, letter_window_ms=3_600_000))
    redis = world.users.client("redsaga.orders")
    bounded = SagaWorker(redis, STATELESS["redsaga.orders"], config=config, consumer="bounded")
    world.workers["redsaga.orders"] = bounded
    return bounded


async def test_a_flood_of_the_inbox_keeps_a_quota_of_letters_per_principal(world: World) -> None:
    orchestrator = _bounded(world)
    cancel = msgspec.json.encode(OperatorRequest(by="mallory", reason="flood"))
    for _ in range(FLOOD):
        await world.forge(CANCEL, cancel)  # signed by payments: checked, then refused
        await world.redis.xadd(ORDERS.inbox.key, {"e": b"\x00junk"})  # no signature at all
    while await world.users.admin.xlen(ORDERS.inbox.key) and await _pending(world):
        await world.step("redsaga.orders")
    letters = await dead_letters(world.users.admin, ORDERS.inbox)
    reasons = [letter["reason"] for letter in letters]
    assert len(letters) == 2 * (QUOTA + 1)  # not 2 * FLOOD
    for principal in ("participant:payments", UNVERIFIED):
        [over] = [
            r for r in reasons if f"dead-letter quota of {QUOTA} per 3600000 ms reached by {principal}" in r
        ]
        assert "counted in rs:{orders:0}:dlq:quota:" in over
    [tally] = [k async for k in world.users.admin.scan_iter("rs:{orders:0}:dlq:quota:*")]
    counted = await world.users.admin.hgetall(tally)
    assert counted == {b"participant:payments": str(FLOOD).encode(), UNVERIFIED.encode(): str(FLOOD).encode()}
    assert 0 < await world.users.admin.pttl(tally) <= 2 * 3_600_000
    assert orchestrator.bus_worker.incidents[LETTERS_OVER_QUOTA] == 2 * (FLOOD - QUOTA)
    assert await _pending(world) == 0  # every entry acknowledged: nothing left to redeliver
    await world.settle()  # and the saga goes on
    assert (await world.state()).status == SagaStatus.COMPLETED


async def _pending(world: World) -> int:
    [group] = await world.users.admin.xinfo_groups(ORDERS.inbox.key)
    return int(group["pending"]) + int(group["lag"] or 0)
