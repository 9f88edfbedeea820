"""Property-based tests of the real decider (through the in-process runner).

Hypothesis scripts every participant attempt by attempt -- success, transient failure,
permanent failure, no reply, late reply, duplicate reply, redelivery -- plus cancels at
random moments, operator retries and cancels of dead-lettered sagas, and a random delivery
order (``reorder=``). Whatever happens (invariants G1-G4 of docs/faults.md):

- every saga settles: it ends, or it is dead-lettered (with steps to retry or undo);
- compensations run exactly for the completed steps that declare one, in strict reverse
  order of completion, each undone once -- in the decider's records and at the participants;
- no participant applies an effect twice for one idempotency key, and every completed
  command step applied its effect exactly once;
- the revision never goes back, status changes follow the lifecycle table, nothing is sent
  for a step after it succeeded, and the decider never raises (no illegal transition);
- replaying each history decides the same; replies and timers delivered again are ignored.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bus import TransientError
from saga import Command, Retry, Saga, SagaStatus, StepContext, command
from saga.core.decider import decide
from saga.core.model import StepReplied, TimerFired
from saga.testing import (
    Behaviour,
    FakeParticipant,
    SagaRunner,
    duplicate_reply,
    fail,
    late_reply,
    no_reply,
    redeliver,
    sequence,
    succeed,
)

Kind = Literal["ok", "transient", "permanent", "lost", "late", "duplicate", "redeliver"]
KINDS: tuple[Kind, ...] = ("ok", "transient", "permanent", "lost", "late", "duplicate", "redeliver")
EXAMPLES = int(os.environ.get("REDSAGA_PROPERTY_EXAMPLES", "250"))
"""Examples of the main property; raise it for a deeper search (the file stays under 20 s at 250)."""
SETTLED = {SagaStatus.DEAD_LETTERED} | {s for s in SagaStatus if s.terminal}


class Order(msgspec.Struct, frozen=True):
    n: int


class Do(msgspec.Struct, tag=True, frozen=True):
    step: str


class Done(msgspec.Struct, tag=True, frozen=True):
    step: str


class Undo(msgspec.Struct, tag=True, frozen=True):
    step: str


class Undone(msgspec.Struct, tag=True, frozen=True):
    step: str


class Total(msgspec.Struct, frozen=True):
    steps: int


# a, c and d declare compensations, b does not; e is a local action (no compensation).
COMMAND_STEPS = ("a", "b", "c", "d")
COMPENSATED = ("a", "c", "d")


def build(on_exhausted: Literal["dead_letter", "compensate"]) -> Saga[Order]:
    retry = Retry(attempts=3, initial=1.0, backoff=2.0, max_delay=8.0, on_exhausted=on_exhausted)
    undo_retry = Retry(attempts=3, initial=1.0, backoff=2.0, max_delay=8.0)
    saga: Saga[Order] = Saga(f"prop_{on_exhausted}", context="props", data=Order)

    def command_step(name: str) -> None:
        def builder(_data: Order) -> Command:
            return command(f"p_{name}", Do(step=name))

        compensate = f"undo_{name}" if name in COMPENSATED else None
        saga.step(reply=Done, name=name, compensate=compensate, retry=retry, timeout=10)(builder)
        if compensate:

            def undo(_data: Order, ctx: StepContext) -> Command:
                assert ctx.output(saga.step_named(name)) == Done(step=name)
                return command(f"p_{name}", Undo(step=name))

            saga.compensation(compensate, retry=undo_retry, timeout=10)(undo)

    for name in COMMAND_STEPS[:2]:
        command_step(name)

    @saga.action(name="e", retry=retry)
    async def total(_data: Order, ctx: StepContext) -> Total:
        return Total(steps=len([ctx.output(saga.step_named(n)) for n in ("a", "b")]))

    for name in COMMAND_STEPS[2:]:
        command_step(name)
    return saga


DEFINITIONS = {"dead_letter": build("dead_letter"), "compensate": build("compensate")}


def behaviour(kind: Kind, reply: msgspec.Struct) -> Behaviour:
    """What one delivery does (the behaviour applies to every delivery that reaches it)."""
    ok = succeed(reply)
    always = 1_000
    return {
        "ok": ok,
        "transient": fail(TransientError("flaky")),
        "permanent": fail("no"),
        "lost": no_reply(),
        "late": late_reply(ok, times=always),
        "duplicate": duplicate_reply(ok),
        "redeliver": redeliver(ok, times=always),
    }[kind]


scripts = st.lists(st.sampled_from(KINDS), min_size=1, max_size=4)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("cancel"), st.integers(0, 2)),
        st.tuples(st.just("advance"), st.integers(0, 25)),
        st.tuples(st.just("idle"), st.just(0)),
    ),
    max_size=4,
)


@st.composite
def worlds(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "on_exhausted": draw(st.sampled_from(sorted(DEFINITIONS))),
        "sagas": draw(st.integers(1, 3)),
        "do": {name: draw(scripts) for name in COMMAND_STEPS},
        "undo": {name: draw(scripts) for name in COMPENSATED},
        "operations": draw(operations),
        "operator": draw(st.lists(st.sampled_from(["retry", "cancel"]), max_size=2)),
        "order": draw(st.randoms(use_true_random=False)),
    }


def participants(world: dict[str, Any]) -> list[FakeParticipant]:
    fakes = []
    for name in COMMAND_STEPS:
        behaviours: dict[type[Any], Behaviour] = {
            Do: sequence(*(behaviour(k, Done(step=name)) for k in world["do"][name]))
        }
        if name in COMPENSATED:
            behaviours[Undo] = sequence(*(behaviour(k, Undone(step=name)) for k in world["undo"][name]))
        fakes.append(FakeParticipant(f"p_{name}", behaviours))
    return fakes


def play(world: dict[str, Any]) -> SagaRunner:
    runner = SagaRunner(
        DEFINITIONS[world["on_exhausted"]], participants=participants(world), reorder=world["order"]
    )
    ids = [runner.start(Order(n=n)) for n in range(world["sagas"])]
    for op, arg in world["operations"]:
        if op == "cancel":
            runner.cancel(ids[arg % len(ids)])
        elif op == "advance":
            runner.advance(seconds=arg)
        else:
            runner.run_until_idle()
    runner.run_until_settled()
    for action in world["operator"]:
        for saga_id in ids:
            if runner.status(saga_id) == SagaStatus.DEAD_LETTERED:
                (runner.retry if action == "retry" else runner.cancel)(saga_id)
        runner.run_until_settled()
    return runner


def check(runner: SagaRunner) -> None:
    runner.assert_invariants()  # G2-G4, lifecycle, nothing sent after success (saga.testing.invariants)
    for saga_id in runner.saga_ids:
        state = runner.state(saga_id)
        event(f"ended {state.status}{' after a cancel' if state.cancel else ''}")
        # G1: settled -- ended, or parked for an operator with a reason.
        assert state.status in SETTLED, f"{saga_id} is stuck in {state.status}"
        if state.status == SagaStatus.DEAD_LETTERED:
            assert state.error is not None

        calls = [c for c in runner.calls if c.saga_id == saga_id]
        done = Counter(c.step for c in calls if c.kind == "do" and c.applied)
        undone = [c.step for c in calls if c.kind == "undo" and c.applied]
        completed = [n for n in state.completed if n in COMMAND_STEPS]
        to_undo = [n for n in state.completed if n in COMPENSATED]

        # Every completed command step took effect exactly once at its participant.
        for name in completed:
            assert done[name] == 1, f"{saga_id}: {name} completed with {done[name]} effects"
        # Undo effects: only for completed steps with a compensation, each once, newest first.
        assert len(undone) == len(set(undone)), f"{saga_id}: a step was undone twice: {undone}"
        assert undone == list(reversed(to_undo))[: len(undone)], (undone, to_undo)
        if state.status in (SagaStatus.COMPENSATED, SagaStatus.CANCELLED):
            assert undone == list(reversed(to_undo))
        if state.status in (SagaStatus.COMPLETED, SagaStatus.FAILED):
            assert undone == []
        if state.status == SagaStatus.COMPLETED:
            assert state.completed == ["a", "b", "e", "c", "d"]
        if state.cancel is None:
            assert state.status != SagaStatus.CANCELLED

        # Replay decides the same, and repeats of recorded replies and timers change nothing.
        assert runner.replay(saga_id) == state
        definition = runner.registry.latest(state.name)
        for entry in runner.history(saga_id):
            if isinstance(entry.event, StepReplied | TimerFired):
                again = decide(definition, state, entry.event)
                assert again.ignored, f"{saga_id}: {entry.event} was applied twice"
                assert again.effects == []


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(world=worlds())
def test_any_mix_of_faults_ends_well(world: dict[str, Any]) -> None:
    check(play(world))


@settings(max_examples=max(20, EXAMPLES // 4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(
        st.sampled_from(["ok", "transient", "lost", "duplicate", "redeliver"]), min_size=1, max_size=3
    ),
    order=st.randoms(use_true_random=False),
)
def test_without_permanent_failures_or_cancels_every_saga_completes_or_waits_for_an_operator(
    kinds: list[Kind], order: random.Random
) -> None:
    # One script for every step: a saga completes unless a step ran out of attempts.
    world = {
        "on_exhausted": "dead_letter",
        "sagas": 2,
        "do": dict.fromkeys(COMMAND_STEPS, kinds),
        "undo": {key: ["ok"] for key in COMPENSATED},
        "operations": [],
        "operator": [],
        "order": order,
    }
    runner = play(world)
    check(runner)
    failures_before_success = next((i for i, k in enumerate(kinds) if k not in {"transient", "lost"}), None)
    for saga_id in runner.saga_ids:
        status = runner.status(saga_id)
        if failures_before_success is not None and failures_before_success < 3:
            assert status == SagaStatus.COMPLETED
        else:
            assert status == SagaStatus.DEAD_LETTERED
            assert runner.state(saga_id).completed == []


def test_the_property_checks_catch_a_broken_decider(monkeypatch: pytest.MonkeyPatch) -> None:
    # The checks are not vacuous: a decider that undoes in completion order is caught.
    from saga.core.compensation_rules import CompensationRules
    from saga.core.states import move_saga

    def forward_order(self: Any) -> None:
        run = self.run
        for name in run.state.completed:
            step = run.definition.step_named(name)
            if step.compensation is not None and run.state.steps[name].status == "succeeded":
                run.dispatch(step, "undo")
                return
        end = SagaStatus.CANCELLED if run.state.cancel is not None else SagaStatus.COMPENSATED
        run.state.status = move_saga(run.state.status, end)

    monkeypatch.setattr(CompensationRules, "continue_compensation", forward_order)
    world = {
        "on_exhausted": "dead_letter",
        "sagas": 1,
        "do": {"a": ["ok"], "b": ["ok"], "c": ["ok"], "d": ["permanent"]},
        "undo": {key: ["ok"] for key in COMPENSATED},
        "operations": [],
        "operator": [],
        "order": random.Random(0),
    }
    with pytest.raises(AssertionError, match="compensations sent in order"):
        check(play(world))
