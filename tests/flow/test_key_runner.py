"""Concurrency keys in the in-process runner: virtual time moves the lines, as Redis does."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

import bus
from saga import InvalidInput, Key, KeyBusy, SagaStatus
from saga.definition.concurrency import Claim
from saga.store.keys import SlotKeys
from saga.store.slots import acquire_call, parse_reply, release_call
from saga.testing import FakeParticipant, SagaRunner, no_reply
from saga.testing.runner_slots import Line
from tests.flow.key_sagas import ENDS, FAILS, LOG, Debit, Notify, Withdrawal, forget, ledger, withdrawal_saga


@pytest.fixture(autouse=True)
def fresh_log() -> Iterator[None]:
    forget()
    yield
    forget()


def silent() -> FakeParticipant:
    """The ledger, never answering (its sagas stay past their first step)."""
    return FakeParticipant("ledger", {Debit: no_reply(), Notify: no_reply()})


def started(saga_ids: list[str]) -> list[str]:
    return [saga_id for saga_id, what in LOG if what == "debit" and saga_id in saga_ids]


def waiting(runner: SagaRunner, saga_id: str) -> bool:
    return any(t.purpose == "slot" for t in runner.timers(saga_id))


def test_one_saga_per_account_at_a_time_in_start_order() -> None:
    saga = withdrawal_saga(Key(lambda d: d.account))
    runner = SagaRunner(saga, participants=[ledger])
    a = [runner.start(Withdrawal("acct-a"), saga_id=f"a{n}") for n in range(3)]
    b = [runner.start(Withdrawal("acct-b"), saga_id=f"b{n}") for n in range(2)]
    runner.run_until_idle()
    assert {runner.status(i) for i in a + b} == {SagaStatus.COMPLETED}
    assert started(a) == a
    mine = [s for s, _ in LOG if s in a]
    assert mine == [s for s in a for _ in range(2)]  # each one's debit and notify together
    for saga_id in a:  # replay applies the recorded holds again: the same decisions
        assert runner.replay(saga_id).status == SagaStatus.COMPLETED


def test_a_singleton_that_skips_refuses_in_the_runner_too() -> None:
    saga = withdrawal_saga(Key(lambda d: d.account, skip_if_running=True))
    runner = SagaRunner(saga, participants=[silent()])  # nothing answers: the first stays running
    runner.start(Withdrawal("acct-a"), saga_id="first")
    runner.run_until_idle()
    with pytest.raises(KeyBusy):
        runner.start(Withdrawal("acct-a"), saga_id="second")


def test_debounce_on_the_virtual_clock() -> None:
    saga = withdrawal_saga(Key(lambda d: d.account, debounce=5.0))
    runner = SagaRunner(saga, participants=[ledger])
    for n in range(3):
        runner.start(Withdrawal("acct-a", amount=n), saga_id=f"s{n}")
        runner.advance(seconds=1)
    assert LOG == []
    runner.advance(seconds=5)
    assert started(["s0", "s1", "s2"]) == ["s2"]
    assert [runner.status(f"s{n}") for n in range(3)] == [
        SagaStatus.CANCELLED, SagaStatus.CANCELLED, SagaStatus.COMPLETED,
    ]  # fmt: skip


def test_a_lower_limit_of_two_with_a_slow_participant() -> None:
    saga = withdrawal_saga(Key(lambda d: d.account, limit=2))
    runner = SagaRunner(saga, participants=[silent()])
    ids = [runner.start(Withdrawal("acct-a"), saga_id=f"s{n}") for n in range(4)]
    runner.run_until_idle()
    assert [i for i in ids if waiting(runner, i)] == ["s2", "s3"]
    runner.cancel("s3")
    runner.run_until_idle()
    assert runner.status("s3") == SagaStatus.CANCELLED


@pytest.mark.parametrize("end", list(ENDS))
def test_the_holder_gives_its_slot_to_the_next_in_line_however_it_ends(end: str) -> None:
    how = ENDS[end]
    saga = withdrawal_saga(Key(lambda d: d.account, poll=600.0))  # no look at the line: the end wakes it
    runner = SagaRunner(saga, participants=[ledger])
    for what, error in how.fails.items():
        FAILS[("holder", what)] = error
    runner.pause("ledger")
    runner.start(Withdrawal("acct-a"), saga_id="holder")
    runner.start(Withdrawal("acct-a"), saga_id="next")
    runner.run_until_idle()
    assert waiting(runner, "next")
    runner.resume("ledger")
    runner.run_until_idle()
    if how.then:
        assert waiting(runner, "next")  # the holder is still running
        if how.then == "cancel":
            runner.cancel("holder", reason="no longer wanted")
            runner.run_until_idle()
        else:
            runner.advance(seconds=60)  # its one retry fails too
    assert runner.status("holder") == how.status
    assert started(["next"]) == ["next"]
    assert runner.status("next") == SagaStatus.COMPLETED


@pytest.mark.anyio
async def test_the_runner_lines_are_the_scripts_twin(real_redis: bus.Redis) -> None:
    """The same asks and releases give the same verdicts, holders and wake-ups in both."""
    for seed in range(8):
        rng = random.Random(seed)
        keys, twin, limit = SlotKeys("twin", f"k{seed}", "v"), Line(), rng.randint(1, 3)
        known: list[str] = []
        for step in range(120):
            if known and rng.random() < 0.35:
                ref = rng.choice(known)
                raw = await release_call(keys, ref, limit, now_ms=step).run(real_redis)
                twin.release(ref)
                expected = (0, twin.fill(limit, step))
            else:
                ref = f"0:s{rng.randint(0, 40)}"
                known.append(ref)
                tenant = rng.choice(["", "t1", "t2", "t3"])
                claim = Claim(
                    "v", rng.choice([0, 0, 1, 5]), tenant, {"": 1, "t1": 1, "t2": 2, "t3": 3}[tenant]
                )
                timers = [f"{ref}:timer"]
                raw = await acquire_call(keys, ref, limit, claim, timers, now_ms=step, mode="wait").run(
                    real_redis
                )
                verdict = twin.acquire(ref, limit, claim, timers, "wait")
                woken = twin.fill(limit, step)
                verdict = 1 if ref in twin.holders else verdict
                expected = (verdict, [(r, t) for r, t in woken if r != ref])
            reply = parse_reply(raw)
            assert (reply.verdict, reply.woken) == expected, (seed, step)
            assert sorted(r for r, _ in reply.holders) == sorted(twin.holders), (seed, step)
            assert reply.waiting == len(twin.waiting)


def test_a_key_function_that_raises_refuses_the_start_as_bad_input() -> None:
    saga = withdrawal_saga(Key(lambda d: d.no_such_field))
    runner = SagaRunner(saga, participants=[ledger])
    with pytest.raises(InvalidInput, match="concurrency key withdraw: reading it from the data failed"):
        runner.start(Withdrawal("acct-a"), saga_id="s0")
