"""Concurrency keys on Redis: one saga per account at a time, the line, singleton, debounce, ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import bus
from bus import FakeClock
from saga import EngineConfig, Key, KeyBusy, SagaAdmin, SagaClient, SagaNotFound, SagaStatus, SagaWorker
from saga.core.rate_rules import held
from saga.store.keys import SlotKeys
from saga.store.slots import ref_of
from tests.flow.key_sagas import ENDS, FAILS, LOG, Withdrawal, bank, forget, withdrawal_saga

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))


@pytest.fixture(autouse=True)
def fresh_log() -> Iterator[None]:
    forget()
    yield
    forget()


def runs(saga_ids: list[str]) -> list[str]:
    """The sagas in the order the ledger saw them start, each once."""
    seen: list[str] = []
    for saga_id, _ in LOG:
        if saga_id in saga_ids and saga_id not in seen:
            seen.append(saga_id)
    return seen


def never_overlap(saga_ids: list[str]) -> None:
    """Each saga's commands come together in the ledger's record: no other saga's between them."""
    mine = [saga_id for saga_id, _ in LOG if saga_id in saga_ids]
    blocks = [s for i, s in enumerate(mine) if i == 0 or mine[i - 1] != s]
    assert len(blocks) == len(set(blocks)), f"sagas of one key overlapped: {mine}"


async def waiting_for_slot(client: SagaClient, saga_id: str) -> bool:
    state = await client.get(saga_id)
    return any(held(saga_id, key, record, "slot") for key, record in state.steps.items())


async def test_one_saga_per_account_runs_at_once_the_others_wait_in_order(redis: bus.Redis) -> None:
    clock = FakeClock()
    saga = withdrawal_saga(Key(lambda d: d.account))
    worker = SagaWorker(redis, bank(saga), config=CONFIG, clock=clock)
    client = SagaClient(redis, worker.app.registry, clock=clock)
    a = [await client.start(saga, Withdrawal("acct-a"), saga_id=f"a{n}") for n in range(4)]
    b = [await client.start(saga, Withdrawal("acct-b"), saga_id=f"b{n}") for n in range(2)]
    await worker.run_until_idle()
    assert {(await client.get(i)).status for i in a + b} == {SagaStatus.COMPLETED}
    assert runs(a) == a  # in the order they were started
    assert runs(b) == b
    never_overlap(a)
    never_overlap(b)
    keys = SlotKeys("bank", "withdraw", "acct-a")
    assert await redis.zcard(keys.holders) == 0  # every slot given back
    assert await redis.hlen(keys.all()[1]) == 0


async def test_a_waiting_saga_sends_nothing_until_a_slot_frees(redis: bus.Redis) -> None:
    clock = FakeClock()
    saga = withdrawal_saga(Key(lambda d: d.account, limit=2))
    orchestrator_only = SagaWorker(redis, bank(saga, with_ledger=False), config=CONFIG, clock=clock)
    client = SagaClient(redis, orchestrator_only.app.registry, clock=clock)
    ids = [await client.start(saga, Withdrawal("acct-a"), saga_id=f"s{n}") for n in range(5)]
    await orchestrator_only.run_until_idle()
    assert [await waiting_for_slot(client, i) for i in ids] == [False, False, True, True, True]
    keys = SlotKeys("bank", "withdraw", "acct-a")
    holders = await redis.zrange(keys.holders, 0, -1)
    assert sorted(h.decode() for h in holders) == [ref_of(0, "s0"), ref_of(0, "s1")]
    clock.advance(30.0)  # many looks at the line: nothing frees, nothing is sent
    await orchestrator_only.run_until_idle()
    assert [await waiting_for_slot(client, i) for i in ids] == [False, False, True, True, True]
    view = await SagaAdmin(redis, orchestrator_only.app, clock=clock).inspect("s3")  # read from the line
    assert view.waiting_for.startswith("a slot of withdraw acct-a, 2nd in line (3 waiting)")
    assert view.waiting_for.endswith("(its next look at the line due in 5.0s)")

    await SagaWorker(redis, bank(saga), config=CONFIG, clock=clock).run_until_idle()
    assert {(await client.get(i)).status for i in ids} == {SagaStatus.COMPLETED}
    assert runs(ids) == ids
    first, last = {}, {}
    for n, (saga_id, _) in enumerate(LOG):
        first.setdefault(saga_id, n)
        last[saga_id] = n
    for n in range(len(LOG)):  # never more than two running, by the ledger's own record
        assert sum(first[s] <= n <= last[s] for s in ids) <= 2


async def test_a_saga_cancelled_in_line_leaves_it_and_runs_nothing(redis: bus.Redis) -> None:
    clock = FakeClock()
    saga = withdrawal_saga(Key(lambda d: d.account))
    orchestrator_only = SagaWorker(redis, bank(saga, with_ledger=False), config=CONFIG, clock=clock)
    client = SagaClient(redis, orchestrator_only.app.registry, clock=clock)
    for n in range(3):
        await client.start(saga, Withdrawal("acct-a"), saga_id=f"s{n}")
    await orchestrator_only.run_until_idle()
    await client.cancel("s1", reason="changed my mind")
    await orchestrator_only.run_until_idle()
    s1 = await client.get("s1")
    assert s1.status == SagaStatus.CANCELLED
    assert s1.steps["debit"].attempts[0].outcome == "cancelled"  # never sent
    keys = SlotKeys("bank", "withdraw", "acct-a")
    assert await redis.hkeys(keys.all()[1]) == [ref_of(0, "s2").encode()]
    await SagaWorker(redis, bank(saga), config=CONFIG, clock=clock).run_until_idle()
    assert runs(["s0", "s1", "s2"]) == ["s0", "s2"]


@pytest.mark.parametrize("end", list(ENDS))
async def test_the_holder_gives_its_slot_to_the_next_in_line_however_it_ends(
    redis: bus.Redis, end: str
) -> None:
    how = ENDS[end]
    clock = FakeClock()
    saga = withdrawal_saga(Key(lambda d: d.account, poll=600.0))  # no look at the line: the end wakes it
    orchestrator_only = SagaWorker(redis, bank(saga, with_ledger=False), config=CONFIG, clock=clock)
    client = SagaClient(redis, orchestrator_only.app.registry, clock=clock)
    for what, error in how.fails.items():
        FAILS[("holder", what)] = error
    await client.start(saga, Withdrawal("acct-a"), saga_id="holder")
    await client.start(saga, Withdrawal("acct-a"), saga_id="next")
    await orchestrator_only.run_until_idle()
    assert await waiting_for_slot(client, "next")
    worker = SagaWorker(redis, bank(saga), config=CONFIG, clock=clock)
    await worker.run_until_idle()
    if how.then:
        assert await waiting_for_slot(client, "next")  # the holder is still running
        if how.then == "cancel":
            await client.cancel("holder", reason="no longer wanted")
        else:
            clock.advance(60.0)  # its one retry fails too
        await worker.run_until_idle()
    assert (await client.get("holder")).status == how.status
    assert ("next", "debit") in LOG
    assert (await client.get("next")).status == SagaStatus.COMPLETED
    assert await redis.zcard(SlotKeys("bank", "withdraw", "acct-a").holders) == 0


async def test_a_singleton_that_skips_refuses_a_start_while_one_runs(redis: bus.Redis) -> None:
    clock = FakeClock()
    saga = withdrawal_saga(Key(lambda d: d.account, skip_if_running=True))
    worker = SagaWorker(redis, bank(saga, with_ledger=False), config=CONFIG, clock=clock)
    client = SagaClient(redis, worker.app.registry, clock=clock)
    await client.start(saga, Withdrawal("acct-a"), saga_id="first")
    with pytest.raises(KeyBusy) as refused:
        await client.start(saga, Withdrawal("acct-a"), saga_id="second")
    assert refused.value.key == "withdraw"
    assert refused.value.value == "acct-a"
    with pytest.raises(SagaNotFound):
        await client.get("second")  # nothing was stored
    assert await client.start(saga, Withdrawal("acct-b"), saga_id="other") == "other"


async def test_debounce_runs_the_last_of_a_burst_and_cancels_the_rest(redis: bus.Redis) -> None:
    clock = FakeClock()
    saga = withdrawal_saga(Key(lambda d: d.account, debounce=10.0))
    worker = SagaWorker(redis, bank(saga), config=CONFIG, clock=clock)
    client = SagaClient(redis, worker.app.registry, clock=clock)
    for n in range(3):
        await client.start(saga, Withdrawal("acct-a", amount=n), saga_id=f"s{n}")
        await worker.run_until_idle()
        clock.advance(2.0)
    assert LOG == []  # inside the window nothing runs
    clock.advance(10.0)
    await worker.run_until_idle()
    assert runs(["s0", "s1", "s2"]) == ["s2"]
    statuses = [(await client.get(f"s{n}")).status for n in range(3)]
    assert statuses == [SagaStatus.CANCELLED, SagaStatus.CANCELLED, SagaStatus.COMPLETED]
    assert (await client.get("s0")).cancel.reason == "replaced by a later start with the same key"  # type: ignore[union-attr]


async def test_priorities_first_then_tenants_by_weight(redis: bus.Redis) -> None:
    clock = FakeClock()
    key = Key(lambda d: "all", priority=lambda d: d.priority, fairness=lambda d: d.tenant, weights={"big": 2})
    saga = withdrawal_saga(key)
    orchestrator_only = SagaWorker(redis, bank(saga, with_ledger=False), config=CONFIG, clock=clock)
    client = SagaClient(redis, orchestrator_only.app.registry, clock=clock)
    await client.start(saga, Withdrawal("x"), saga_id="blocker")
    for n in range(6):
        await client.start(saga, Withdrawal("x", tenant="big"), saga_id=f"big{n}")
    for n in range(3):
        await client.start(saga, Withdrawal("x", tenant="small"), saga_id=f"small{n}")
    await client.start(saga, Withdrawal("x", priority=5, tenant="small"), saga_id="urgent")
    await orchestrator_only.run_until_idle()
    await SagaWorker(redis, bank(saga), config=CONFIG, clock=clock).run_until_idle()
    order = runs(["blocker", "urgent", *(f"big{n}" for n in range(6)), *(f"small{n}" for n in range(3))])
    assert order == [
        "blocker", "urgent", "big0", "small0", "big1", "big2", "small1", "big3", "big4", "small2", "big5",
    ]  # fmt: skip


async def test_a_slot_kept_by_a_saga_that_ended_is_taken_back_at_the_next_look(redis: bus.Redis) -> None:
    """A worker killed between a saga's end and giving its slot back: the next in line mends it."""
    clock = FakeClock()
    saga = withdrawal_saga(Key(lambda d: d.account, poll=5.0))
    worker = SagaWorker(redis, bank(saga), config=CONFIG, clock=clock)
    client = SagaClient(redis, worker.app.registry, clock=clock)
    keys = SlotKeys("bank", "withdraw", "acct-a")
    await client.start(saga, Withdrawal("acct-a"), saga_id="done")
    await worker.run_until_idle()
    assert (await client.get("done")).status == SagaStatus.COMPLETED
    await redis.zadd(keys.holders, {ref_of(0, "done"): clock.now_ms()})  # as if never given back
    await client.start(saga, Withdrawal("acct-a"), saga_id="next")
    await worker.run_until_idle()
    assert await waiting_for_slot(client, "next")
    clock.advance(5.0)  # its look finds the holder ended
    await worker.run_until_idle()
    clock.advance(5.0)
    await worker.run_until_idle()
    assert (await client.get("next")).status == SagaStatus.COMPLETED
