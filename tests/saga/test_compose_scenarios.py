"""Composed sagas, one table of scenarios, on the in-process runner and on Redis.

Groups (fan-out/fan-in with bounded concurrency, a map), first-of-N, child sagas (in
another context) and TCC steps, driven by the saga's plan: which pieces fail for good,
fail a few times, cancel the saga, whose undo or confirmation fails. Each scenario runs on
the runner and on Redis (fakeredis and real, through ``SagaWorker.run_until_idle`` with a
``FakeClock``); both must end alike -- status, every step's and branch's record, completion
and compensation order, the attempts' timelines, the participant's effects (each once) --
and the Redis history must replay exactly and keep the invariants (G3: undo exactly the
completed steps and branches, in reverse order of completion).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bus
from bus import FakeClock
from saga import App, Saga, SagaClient, SagaNotFound, SagaState, SagaStatus, SagaWorker, Versions
from saga.testing import Summary
from tests.saga.compose_backends import RedisBackend, RunnerBackend
from tests.saga.compose_sagas import Plan, Services, bill, fan, invoicing, parent, race, seats

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
ITEMS = ["a", "b", "c", "d"]


@dataclass(frozen=True)
class Scenario:
    name: str
    definition: Saga[Plan]
    plan: Plan
    status: SagaStatus
    compensated: tuple[str, ...] = ()
    statuses: dict[str, str] = field(default_factory=dict)
    script: tuple[tuple[str, ...], ...] = (("settle",),)

    @property
    def saga_id(self) -> str:
        return f"s-{self.name}"


def plan(**faults: Any) -> Plan:
    return Plan(id="p1", **faults)


SCENARIOS = [
    Scenario(
        "fan_happy",
        fan,
        plan(items=ITEMS),
        SagaStatus.COMPLETED,
        statuses={"book#2": "succeeded", "item#3": "succeeded", "book": "succeeded", "item": "succeeded"},
    ),
    Scenario(
        "fan_branch_fails",
        fan,
        plan(items=ITEMS, fail=["hotel"]),
        SagaStatus.COMPENSATED,
        compensated=("book#0", "prepare"),  # car (no compensation) was in flight: awaited, kept
        statuses={"book#1": "failed", "book#2": "succeeded", "book": "failed", "item": "pending"},
    ),
    Scenario(
        "fan_item_fails",
        fan,
        plan(items=ITEMS, fail=["item-c"]),
        SagaStatus.COMPENSATED,
        compensated=("item#3", "item#1", "item#0", "book#1", "book#0", "prepare"),
        statuses={"item#2": "failed", "item#3": "compensated", "book": "compensated"},
    ),
    Scenario(
        "fan_flaky_branch",
        fan,
        plan(items=ITEMS, flaky={"hotel": 2, "item-b": 1}),
        SagaStatus.COMPLETED,
        statuses={"book#1": "succeeded"},
    ),
    Scenario(
        "fan_map_over_the_limit",
        fan,
        plan(items=[str(n) for n in range(51)]),
        SagaStatus.COMPENSATED,
        compensated=("book#1", "book#0", "prepare"),
        statuses={"item": "failed"},
    ),
    Scenario("fan_empty_map", fan, plan(items=[]), SagaStatus.COMPLETED, statuses={"item": "succeeded"}),
    Scenario(
        "fan_cancelled_mid_group",
        fan,
        plan(items=ITEMS, cancel_on=["flight"]),
        SagaStatus.CANCELLED,
        compensated=("book#1", "book#0", "prepare"),  # hotel was in flight: it completed, so undone
        statuses={"book#2": "pending", "item": "pending"},  # car never started
    ),
    Scenario(
        "fan_undo_fails_for_good",
        fan,
        plan(items=["a"], fail=["finish"], undo_fail=["hotel"]),
        SagaStatus.DEAD_LETTERED,
        compensated=("item#0", "book#1"),
        statuses={"book#1": "compensation_failed"},
    ),
    Scenario(
        "fan_branch_out_of_attempts_then_operator_retry",
        fan,
        plan(items=ITEMS, flaky={"hotel": 3}),
        SagaStatus.COMPLETED,
        statuses={"book#1": "succeeded"},
        script=(("settle",), ("expect", "dead_lettered"), ("retry",), ("settle",)),
    ),
    Scenario(
        "race_first_wins_and_the_other_is_undone",
        race,
        plan(),
        SagaStatus.COMPLETED,
        compensated=("quote#1",),  # fast completed too (it was in flight): undone before going on
        statuses={"quote#0": "succeeded", "quote#1": "compensated", "quote#2": "pending"},
    ),
    Scenario(
        "race_first_fails_second_wins",
        race,
        plan(fail=["cheap"]),
        SagaStatus.COMPLETED,
        compensated=("quote#2",),
        statuses={"quote#0": "failed", "quote#1": "succeeded", "quote#2": "compensated"},
    ),
    Scenario("race_all_fail", race, plan(fail=["cheap", "fast", "fancy"]), SagaStatus.FAILED),
    Scenario(
        "child_completes",
        parent,
        plan(),
        SagaStatus.COMPLETED,
        statuses={"bill": "succeeded", "ship": "succeeded"},
    ),
    Scenario(
        "child_fails_and_the_parent_compensates",
        parent,
        plan(fail=["send"]),
        SagaStatus.COMPENSATED,
        compensated=("reserve",),
        statuses={"bill": "failed"},
    ),
    Scenario(
        "cancelling_the_parent_cancels_the_child",
        parent,
        plan(cancel_on=["issue"]),
        SagaStatus.CANCELLED,
        compensated=("reserve",),
        statuses={"bill": "failed", "ship": "pending"},
    ),
    Scenario(
        "tcc_confirmed",
        seats,
        plan(),
        SagaStatus.COMPLETED,
        statuses={"hold_seat": "confirmed"},
    ),
    Scenario(
        "tcc_cancelled_when_a_later_step_fails",
        seats,
        plan(fail=["pay"]),
        SagaStatus.COMPENSATED,
        compensated=("hold_seat",),
        statuses={"hold_seat": "compensated"},
    ),
    Scenario(
        "tcc_reservation_expires",
        seats,
        plan(nap=600),
        SagaStatus.COMPENSATED,
        compensated=("hold_seat",),
        statuses={"hold_seat": "compensated", "nap": "failed", "pay": "pending"},
    ),
    Scenario(
        "tcc_confirmation_fails_for_good",
        seats,
        plan(confirm_fail=["seat"]),
        SagaStatus.DEAD_LETTERED,
        statuses={"hold_seat": "confirm_failed", "pay": "succeeded"},
    ),
]


def check(scenario: Scenario, summary: Summary) -> None:
    assert summary.status == scenario.status
    assert summary.compensated == scenario.compensated
    for name, status in scenario.statuses.items():
        got = summary.steps[name].status if name in summary.steps else "pending"
        assert got == status, f"{name}: {got} != {status}"


async def play(backend: RunnerBackend | RedisBackend, scenario: Scenario) -> tuple[Summary, SagaState]:
    """Run ``scenario``'s script on ``backend``; the saga's summary and final state."""
    saga_id = await backend.start(scenario.definition, scenario.plan, scenario.saga_id)
    for op in scenario.script:
        match op:
            case ("settle",):
                await backend.settle(saga_id)
            case ("expect", status):
                assert await backend.status(saga_id) == status
            case ("retry",):
                await backend.retry(saga_id)
    return await backend.summary(scenario.definition, saga_id)


def timeline(state: SagaState) -> dict[str, list[tuple[str, int, str | None, int, int | None]]]:
    start = state.created_ms
    return {
        name: [
            (
                a.kind,
                a.n,
                a.outcome,
                a.dispatched_ms - start,
                None if a.ended_ms is None else a.ended_ms - start,
            )
            for a in step.attempts
        ]
        for name, step in [*state.steps.items(), *state.branches.items()]
    }


def effects_once(services: Services) -> None:
    twice = [e for e, n in Counter(services.effects).items() if n > 1]
    assert twice == [], f"effects applied more than once: {twice}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_scenario_on_the_runner_matches_redis(scenario: Scenario, redis: bus.Redis) -> None:
    on_runner = RunnerBackend()
    runner_summary, runner_state = await play(on_runner, scenario)
    check(scenario, runner_summary)
    effects_once(on_runner.services)

    on_redis = RedisBackend(redis)
    with anyio.fail_after(60):
        redis_summary, redis_state = await play(on_redis, scenario)
    assert redis_summary == runner_summary
    assert timeline(redis_state) == timeline(runner_state)
    assert sorted(on_redis.services.effects) == sorted(on_runner.services.effects)
    effects_once(on_redis.services)


PIECES = ["prepare", "flight", "hotel", "car", "item-a", "item-b", "item-c", "finish"]


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    return Plan(
        id="p",
        items=draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True)),
        fail=draw(st.lists(st.sampled_from(PIECES), max_size=2, unique=True)),
        flaky={
            piece: draw(st.integers(1, 3)) for piece in draw(st.lists(st.sampled_from(PIECES), max_size=3))
        },
        undo_fail=draw(st.lists(st.sampled_from(["prepare", "flight", "hotel"]), max_size=1)),
        cancel_on=draw(st.lists(st.sampled_from(["prepare", "flight"]), max_size=1)),
    )


@settings(
    max_examples=int(os.environ.get("REDSAGA_BACKEND_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=plans())
def test_random_plans_end_alike_on_the_runner_and_fakeredis(plan: Plan) -> None:
    scenario = Scenario("random", fan, plan, SagaStatus.COMPLETED)

    async def compare() -> None:
        on_runner = RunnerBackend()
        runner_summary, runner_state = await play(on_runner, scenario)
        redis = bus.connect(bus.MEMORY_URL)
        try:
            on_redis = RedisBackend(redis)
            with anyio.fail_after(60):
                redis_summary, redis_state = await play(on_redis, scenario)
        finally:
            await redis.aclose()
        assert redis_summary == runner_summary
        assert timeline(redis_state) == timeline(runner_state)
        assert sorted(on_redis.services.effects) == sorted(on_runner.services.effects)
        effects_once(on_redis.services)

    anyio.run(compare)


@dataclass
class TwoContexts:
    """The parent saga's context (orders) and its child's (billing), each with its own worker."""

    redis: bus.Redis
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        async def cancel(_saga_id: str) -> None:
            return None

        self.orders = App("orders", sagas=[parent])  # knows the child only through its step
        self.billing = App("billing", sagas=[invoicing])
        participants = App("worker", participants=[Services(cancel).build()])
        self.workers = [
            SagaWorker(self.redis, self.orders, clock=self.clock, consumer="orders"),
            SagaWorker(self.redis, self.billing, clock=self.clock, consumer="billing"),
            SagaWorker(self.redis, participants, clock=self.clock, consumer="w"),
        ]
        self.client = SagaClient(self.redis, self.orders.registry, clock=self.clock)
        self.children = SagaClient(self.redis, self.billing.registry, clock=self.clock)

    async def run(self, saga_id: str) -> SagaState:
        """Start a parent saga and run every worker until it ended; its final state."""
        await self.client.start(parent, Plan(id=saga_id), saga_id=saga_id)
        with anyio.fail_after(30):
            for _ in range(20):
                for worker in self.workers:
                    await worker.run_until_idle()
                if (await self.client.get(saga_id)).status.terminal:
                    break
        return await self.client.get(saga_id)


async def test_a_child_in_another_context_runs_on_that_contexts_own_workers(redis: bus.Redis) -> None:
    contexts = TwoContexts(redis)
    state = await contexts.run("x")
    assert state.status == SagaStatus.COMPLETED
    child = await contexts.children.get("x/bill")
    assert child.status == SagaStatus.COMPLETED
    assert child.parent is not None
    assert child.parent.saga_id == "x"


async def test_a_child_that_cannot_start_fails_its_parents_step_with_the_reason(redis: bus.Redis) -> None:
    """The child's version is drained: the parent's step fails permanently and is compensated."""
    contexts = TwoContexts(redis)
    await contexts.workers[1].register()
    await Versions(redis, clock=contexts.clock).drain(
        invoicing.name, invoicing.version, by="ops", reason="retired"
    )
    state = await contexts.run("y")
    assert state.status == SagaStatus.COMPENSATED
    [attempt] = state.steps[bill.name].attempts
    assert attempt.outcome == "permanent"
    assert "child saga y/bill could not start: VersionDrained" in (attempt.error or "")
    assert state.steps["reserve"].status == "compensated"
    with pytest.raises(SagaNotFound):
        await contexts.children.get("y/bill")
