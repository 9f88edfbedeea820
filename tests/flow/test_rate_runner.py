"""Rate limits in the in-process runner: virtual time fills the buckets, replay holds again."""

from __future__ import annotations

import pytest

import bus
from bus import FakeClock
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import inventory, payments, shipping
from saga import RateLimit, SagaStatus
from saga.definition.rate import Limits
from saga.store.rates import take_call
from saga.testing import SagaRunner
from saga.testing.runner_rates import MemoryBuckets

PARTICIPANTS = [inventory, payments, shipping]


def order(n: int) -> Order:
    return Order(id=f"o{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=100)


def sent_to(runner: SagaRunner, participant: str) -> int:
    return sum(1 for _, dispatch in runner.dispatched if dispatch.participant == participant)


def test_a_limit_holds_commands_until_the_virtual_clock_brings_their_tokens() -> None:
    runner = SagaRunner(order_fulfilment, participants=PARTICIPANTS, limits=[RateLimit("payments", "2/s")])
    ids = [runner.start(order(n)) for n in range(5)]
    runner.run_until_idle()
    assert sent_to(runner, "payments") == 1
    assert sorted(t.purpose for t in runner.timers() if t.purpose == "rate") == ["rate"] * 4
    runner.advance(seconds=1)
    assert sent_to(runner, "payments") == 3  # two a second
    runner.advance(seconds=1)
    assert sent_to(runner, "payments") == 5
    assert {runner.status(i) for i in ids} == {SagaStatus.COMPLETED}
    for saga_id in ids:  # replay applies the recorded holds again: the same decisions
        assert runner.replay(saga_id).status == SagaStatus.COMPLETED


def test_a_cancelled_waiting_command_is_never_sent_and_uses_no_token() -> None:
    runner = SagaRunner(
        order_fulfilment, participants=PARTICIPANTS, limits=[RateLimit("inventory", "1/s", burst=1)]
    )
    first, second, third = (runner.start(order(n)) for n in range(3))
    runner.run_until_idle()
    runner.cancel(second)
    runner.run_until_idle()
    assert runner.status(second) == SagaStatus.CANCELLED
    assert runner.state(second).steps["reserve_stock"].attempts[0].outcome == "cancelled"
    runner.advance(seconds=2)  # third's token was promised for +2 s: promises keep their times
    assert runner.status(third) == SagaStatus.COMPLETED
    assert runner.status(first) == SagaStatus.COMPLETED
    assert sent_to(runner, "inventory") == 2
    fourth = runner.start(order(4))  # second's token is back in the bucket: fourth goes at once
    runner.run_until_idle()
    assert sent_to(runner, "inventory") == 3
    assert runner.status(fourth) == SagaStatus.COMPLETED


@pytest.mark.anyio
async def test_the_runner_buckets_are_the_scripts_twin(real_redis: bus.Redis) -> None:
    """The same takes and releases at the same times give the same answers in both."""
    limit = RateLimit("twin", "3/s", burst=2)
    clock = FakeClock(1_000_000)
    twin = MemoryBuckets(Limits([limit]), clock)
    steps = [(0, "a", "take"), (0, "b", "take"), (0, "c", "take"), (0, "d", "take"), (100, "c", "release"),
             (150, "e", "take"), (150, "b", "take"), (150, "x", "release"), (2000, "f", "take"),
             (2000, "g", "take"), (2001, "h", "take")]  # fmt: skip
    for at, command, mode in steps:
        clock.advance(ms=1_000_000 + at - clock.now_ms())
        call = take_call(limit, command, now_ms=clock.now_ms(), release=mode == "release")
        reply = await call.run(real_redis)
        if mode == "release":
            assert bool(reply) == twin.release(limit, command), (at, command)
        else:
            assert int(reply[0]) == twin.take(limit, command), (at, command)
