"""Property test: timers, replies, signals, events, cancels and the deadline in any order.

Hypothesis scripts the participants (success, transient and permanent failures, lost, late
and duplicate replies, redeliveries), and interleaves signals (early, on time, repeated,
late), other contexts' events (matching or not, before or after the wait registers),
cancels and clock advances, with a random delivery order. Whatever happens, the decider
never takes a transition the lifecycle tables do not list (it would raise), every saga
settles by its deadline (ended, or dead-lettered for an operator), the invariants of
Invariants G2-G4 hold, replay decides the same, and a repeat of any recorded event changes
nothing.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import msgspec
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from saga import Command, Retry, Saga, SagaStatus, StepContext, command
from saga.core.decider import decide
from saga.testing import FakeParticipant, SagaRunner, sequence
from tests.saga.test_properties import KINDS, Do, Done, Undo, Undone, behaviour

EXAMPLES = int(os.environ.get("REDSAGA_PROPERTY_EXAMPLES", "250")) // 2
STREAM = "elsewhere.events"
SETTLED = {SagaStatus.DEAD_LETTERED} | {s for s in SagaStatus if s.terminal}


class Case(msgspec.Struct, frozen=True):
    n: int


class Approval(msgspec.Struct, frozen=True):
    ok: bool


class Happened(msgspec.Struct, tag=True, frozen=True):
    case: int


RETRY = Retry(attempts=3, initial=1.0, max_delay=4.0)
waits: Saga[Case] = Saga("waits", context="props", data=Case, deadline=timedelta(seconds=40))


def _command_step(name: str) -> None:
    def build(_data: Case, ctx: StepContext) -> Command:
        if name == "a":
            ctx.resume_token("approve")  # builders may make tokens for later waits
        return command(f"p_{name}", Do(step=name))

    def undo(_data: Case) -> Command:
        return command(f"p_{name}", Undo(step=name))

    waits.step(reply=Done, name=name, compensate=f"undo_{name}", retry=RETRY, timeout=10)(build)
    waits.compensation(f"undo_{name}", retry=RETRY, timeout=10)(undo)


_command_step("a")
waits.wait_signal("approve", output=Approval, timeout=timedelta(seconds=15))
_command_step("b")
waits.sleep("pause", timedelta(seconds=5))
waits.wait_event(
    "happened",
    stream=STREAM,
    message=Happened,
    key=lambda e: e.case,
    match=lambda d: d.n,
    timeout=timedelta(seconds=20),
)
_command_step("c")

operations = st.lists(
    st.one_of(
        st.tuples(st.just("signal"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("event"), st.integers(0, 3), st.booleans()),
        st.tuples(st.just("advance"), st.integers(0, 30), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 2), st.booleans()),
        st.tuples(st.just("idle"), st.just(0), st.booleans()),
    ),
    max_size=12,
)
scripts = st.lists(st.sampled_from(KINDS), min_size=1, max_size=3)


@st.composite
def worlds(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "sagas": draw(st.integers(1, 3)),
        "do": {name: draw(scripts) for name in "abc"},
        "undo": {name: draw(scripts) for name in "abc"},
        "operations": draw(operations),
        "helpful": draw(st.booleans()),
        "order": draw(st.randoms(use_true_random=False)),
    }


def play(world: dict[str, Any]) -> SagaRunner:
    fakes = [
        FakeParticipant(
            f"p_{name}",
            {
                Do: sequence(*(behaviour(k, Done(step=name)) for k in world["do"][name])),
                Undo: sequence(*(behaviour(k, Undone(step=name)) for k in world["undo"][name])),
            },
        )
        for name in "abc"
    ]
    runner = SagaRunner(waits, participants=fakes, reorder=world["order"])
    ids = [runner.start(Case(n=n)) for n in range(world["sagas"])]
    for op, arg, flag in world["operations"]:
        saga_id = ids[arg % len(ids)]
        if op == "signal":
            runner.signal(runner.resume_token(saga_id, "approve"), Approval(ok=flag))
        elif op == "event":
            runner.publish(STREAM, Happened(case=arg if flag else 99))
        elif op == "advance":
            runner.advance(seconds=arg)
        elif op == "cancel":
            runner.cancel(saga_id)
        else:
            runner.run_until_idle()
    if world["helpful"]:  # everyone does their part (possibly again, possibly late)
        for n, saga_id in enumerate(ids):
            runner.signal(runner.resume_token(saga_id, "approve"), Approval(ok=True))
            runner.publish(STREAM, Happened(case=n))
    runner.run_until_settled(within=timedelta(minutes=10))
    return runner


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(world=worlds())
def test_any_interleaving_of_time_replies_and_signals_keeps_the_lifecycle(world: dict[str, Any]) -> None:
    runner = play(world)  # an illegal transition raises IllegalTransition in here
    runner.assert_invariants()
    for saga_id in runner.saga_ids:
        state = runner.state(saga_id)
        event(f"ended {state.status}{' (deadline)' if state.expired else ''}")
        assert state.status in SETTLED, f"{saga_id} is stuck in {state.status} after its deadline"
        assert state.wait is None
        assert runner.timers(saga_id) == [] or state.status == SagaStatus.DEAD_LETTERED
        approve = state.steps["approve"]
        assert sum(1 for a in approve.attempts if a.outcome == "ok") <= 1
        assert runner.replay(saga_id) == state
        for entry in runner.history(saga_id):
            again = decide(waits, state, entry.event)
            assert again.ignored, f"{saga_id}: {entry.event} was applied twice"
            assert again.effects == []
