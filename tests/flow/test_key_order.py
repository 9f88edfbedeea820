"""Priorities and weights, shown by the order 1,000 queued starts are served in.

One line (limit 1) held by a blocker; 1,000 sagas queue behind it: 50 urgent ones (priority
5) among 950 at priority 0 from three tenants, ``checkout`` (weight 3, 200 sagas), ``bulk``
(weight 1, 650) and ``reports`` (weight 1, 100), arriving interleaved. Then each holder in
turn gives its slot back and the order the line serves them in is recorded: by the line's
scripts alone, and through the engine (started by the client, run by a worker, the order
read from the ledger participant's own record).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import pytest

import bus
from bus import FakeClock
from saga import Key, SagaClient, SagaStatus, SagaWorker
from saga.definition.concurrency import Claim
from saga.store.keys import SlotKeys
from saga.store.slots import GRANTED, acquire_call, parse_reply, release_call
from tests.flow.key_sagas import LOG, Withdrawal, bank, forget, withdrawal_saga

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
WEIGHTS = {"checkout": 3, "bulk": 1, "reports": 1}


@pytest.fixture(autouse=True)
def fresh_log() -> Iterator[None]:
    forget()
    yield
    forget()


def arrivals() -> list[tuple[str, Claim]]:
    """The 1,000 starts in the order they arrive (a fixed shuffle)."""
    starts = [(f"urgent{n}", Claim("all", 5, "checkout", 3)) for n in range(50)]
    starts += [(f"checkout{n}", Claim("all", 0, "checkout", 3)) for n in range(200)]
    starts += [(f"bulk{n}", Claim("all", 0, "bulk", 1)) for n in range(650)]
    starts += [(f"reports{n}", Claim("all", 0, "reports", 1)) for n in range(100)]
    random.Random(7).shuffle(starts)
    return starts


async def test_1000_queued_starts_go_by_priority_then_by_tenant_weight(redis: bus.Redis) -> None:
    keys = SlotKeys("orders", "imports", "all")
    blocker = await acquire_call(keys, "0:blocker", 1, Claim("all"), [], now_ms=1, mode="wait").run(redis)
    assert parse_reply(blocker).verdict == GRANTED
    starts = arrivals()
    for n, (saga_id, claim) in enumerate(starts):
        reply = parse_reply(
            await acquire_call(keys, f"0:{saga_id}", 1, claim, [], now_ms=2 + n, mode="wait").run(redis)
        )
        assert reply.place >= 1
    served: list[str] = []
    holder = "0:blocker"
    for n in range(len(starts)):
        reply = parse_reply(await release_call(keys, holder, 1, now_ms=2000 + n).run(redis))
        [(holder, _)] = reply.woken
        served.append(holder.removeprefix("0:"))
    assert parse_reply(await release_call(keys, holder, 1, now_ms=5000).run(redis)).woken == []
    served_in_order(served, [saga_id for saga_id, _ in starts])


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_1000_sagas_started_behind_a_blocker_run_by_priority_then_by_tenant_weight(
    real_redis: bus.Redis,
) -> None:
    clock = FakeClock()
    key = Key(lambda d: "all", priority=lambda d: d.priority, fairness=lambda d: d.tenant, weights=WEIGHTS)
    saga = withdrawal_saga(key)
    worker = SagaWorker(real_redis, bank(saga), clock=clock)
    client = SagaClient(real_redis, worker.app.registry, clock=clock)
    await client.start(saga, Withdrawal("x"), saga_id="blocker")  # takes the slot at its start
    starts = arrivals()
    for saga_id, claim in starts:  # each joins the line as its start is stored, in this order
        await client.start(
            saga, Withdrawal("x", priority=claim.priority, tenant=claim.tenant), saga_id=saga_id
        )
    await worker.run_until_idle(max_rounds=100_000)
    assert {(await client.get(s)).status for s, _ in starts} == {SagaStatus.COMPLETED}
    served = [saga_id for saga_id, what in LOG if what == "debit"]
    assert served[0] == "blocker"
    served_in_order(served[1:], [saga_id for saga_id, _ in starts])


def served_in_order(served: list[str], order_in: list[str]) -> None:
    """Urgent first in start order; then each tenant's in start order, 3:1:1 while all three wait."""
    assert len(served) == len(order_in)
    assert served[:50] == [s for s in order_in if s.startswith("urgent")]  # the higher priority first
    for tenant in WEIGHTS:  # each tenant's own sagas in the order they arrived
        assert [s for s in served[50:] if s.startswith(tenant)] == [
            s for s in order_in if s.startswith(tenant)
        ]
    first = Counter(s.rstrip("0123456789") for s in served[50:350])  # while all three wait
    assert abs(first["checkout"] - 180) <= 2, first  # 3 : 1 : 1
    assert abs(first["bulk"] - 60) <= 2, first
    assert abs(first["reports"] - 60) <= 2, first
