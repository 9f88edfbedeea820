"""Property-based tests of group steps (through the in-process runner and the real decider).

Hypothesis scripts every branch (and every step around the groups) attempt by attempt --
success, transient failure, permanent failure, no reply, late reply, duplicate reply,
redelivery -- for its step and its compensation, draws the concurrency limits and the map's
item count, delivers in a random order (``reorder=``), cancels at random moments and
plays an operator's retry or cancel on dead-lettered sagas. Whatever happens:

- every saga settles (it ends, or is dead-lettered with a reason);
- **fan-in happens exactly once**: a group completes at most once, only after every branch
  succeeded (``parallel``, ``map``) or a branch won (``first_of``), and the step after it
  is sent once;
- **compensations run exactly for the completed branches and steps, in reverse order of
  completion**, each once -- in the decider's records and at the participant;
- no more branches are in flight than the concurrency limit allows;
- **late replies change nothing**: every recorded reply and timer, delivered again, is
  ignored; so is a reply to a branch that never started;
- replay decides the same, and every effect happens once per idempotency key.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections import Counter
from functools import cache
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from bus import TransientError
from saga import Command, CommandContext, Retry, Saga, SagaStatus, command
from saga.core.decider import decide
from saga.core.effects import Dispatch
from saga.core.model import StepReplied, TimerFired
from saga.testing import (
    Behaviour,
    FakeParticipant,
    RunnerError,
    SagaRunner,
    duplicate_reply,
    fail,
    late_reply,
    no_reply,
    redeliver,
    sequence,
    succeed,
)
from saga.testing.fakes import Response
from saga.testing.invariants import _forward_undos, completion_order

Kind = Literal["ok", "transient", "permanent", "lost", "late", "duplicate", "redeliver"]
KINDS: tuple[Kind, ...] = ("ok", "transient", "permanent", "lost", "late", "duplicate", "redeliver")
EXAMPLES = int(os.environ.get("REDSAGA_PROPERTY_EXAMPLES", "250"))
SETTLED = {SagaStatus.DEAD_LETTERED} | {s for s in SagaStatus if s.terminal}
CONCURRENCY = (1, 2, None)


class Order(msgspec.Struct, frozen=True):
    items: int


class Do(msgspec.Struct, tag=True, frozen=True):
    key: str


class Done(msgspec.Struct, tag=True, frozen=True):
    key: str


class Undo(msgspec.Struct, tag=True, frozen=True):
    key: str


@cache
def fan_saga(on_exhausted: str, group_limit: int | None, map_limit: int | None) -> Saga[Order]:
    """a -> parallel g (x, y, z; y has no compensation) -> map m -> b."""
    retry = Retry(attempts=3, initial=1.0, max_delay=4.0, on_exhausted=on_exhausted)  # type: ignore[arg-type]
    undo_retry = Retry(attempts=3, initial=1.0, max_delay=4.0)
    saga: Saga[Order] = Saga(f"fan_{on_exhausted}_{group_limit}_{map_limit}", context="props", data=Order)

    def step(name: str, compensated: bool) -> None:
        def build(_data: Order, ctx: Any) -> Command:
            return command("p", Do(key=ctx.step))

        saga.step(
            reply=Done, name=name, compensate=f"undo_{name}" if compensated else None, retry=retry, timeout=10
        )(build)

    def undo(name: str) -> None:
        def build(_data: Order, ctx: Any) -> Command:
            return command("p", Undo(key=ctx.step))

        saga.compensation(f"undo_{name}", retry=undo_retry, timeout=10)(build)

    step("a", compensated=True)
    undo("a")
    group = saga.parallel("g", concurrency=group_limit)
    for name, compensated in (("x", True), ("y", False), ("z", True)):

        def branch(_data: Order, ctx: Any) -> Command:
            return command("p", Do(key=ctx.step))

        group.step(
            reply=Done, name=name, compensate=f"undo_{name}" if compensated else None, retry=retry, timeout=10
        )(branch)
        if compensated:
            undo(name)

    def each(_data: Order, _item: int, ctx: Any) -> Command:
        return command("p", Do(key=ctx.step))

    saga.map(
        items=lambda order: list(range(order.items)),
        reply=Done,
        compensate="undo_m",
        concurrency=map_limit,
        retry=retry,
        timeout=10,
        name="m",
    )(each)
    undo("m")
    step("b", compensated=True)
    undo("b")
    return saga


@cache
def race_saga(limit: int | None) -> Saga[Order]:
    """a -> first_of q (q0, q1, q2) -> b."""
    retry = Retry(attempts=3, initial=1.0, max_delay=4.0, on_exhausted="compensate")
    saga: Saga[Order] = Saga(f"race_{limit}", context="props", data=Order)

    def build(_data: Order, ctx: Any) -> Command:
        return command("p", Do(key=ctx.step))

    def undo(_data: Order, ctx: Any) -> Command:
        return command("p", Undo(key=ctx.step))

    saga.step(reply=Done, name="a", compensate="undo_a", retry=retry, timeout=10)(build)
    saga.compensation("undo_a", retry=retry, timeout=10)(undo)
    group = saga.first_of("q", concurrency=limit)
    for name in ("q0", "q1", "q2"):
        group.step(reply=Done, name=name, compensate=f"undo_{name}", retry=retry, timeout=10)(build)
        saga.compensation(f"undo_{name}", retry=retry, timeout=10)(undo)
    saga.step(reply=Done, name="b", compensate="undo_b", retry=retry, timeout=10)(build)
    saga.compensation("undo_b", retry=retry, timeout=10)(undo)
    return saga


def behaviour(kind: Kind, output: Any) -> Behaviour:
    ok = succeed(output)
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


def by_key(scripts: dict[str, list[Kind]], reply: type[Any], default: list[Kind]) -> Behaviour:
    """Each step or branch (the command's ``ctx.step``) follows its own script."""

    def bind(previous: Behaviour | None) -> Any:
        ready: dict[str, Behaviour] = {}

        def respond(message: Any, ctx: CommandContext) -> Response:
            if ctx.step not in ready:
                script = scripts.get(ctx.step, default)
                ready[ctx.step] = sequence(*(behaviour(k, reply(key=ctx.step)) for k in script)).bound(
                    previous
                )
            return ready[ctx.step].respond(message, ctx)

        return respond

    return Behaviour("by_key", bind)


scripts = st.lists(st.sampled_from(KINDS), min_size=1, max_size=3)
undo_scripts = st.lists(
    st.sampled_from(("ok", "transient", "duplicate", "late", "permanent")), min_size=1, max_size=2
)
KEYS = ["a", "g#0", "g#1", "g#2", *(f"m#{i}" for i in range(5)), "b", "q#0", "q#1", "q#2"]


@st.composite
def worlds(draw: st.DrawFn) -> dict[str, Any]:
    # Mostly successes, so that groups often complete or fail late (more to compensate).
    likely_ok = st.one_of(st.just(["ok"]), st.just(["ok"]), scripts)
    return {
        "race": draw(st.booleans()),
        "on_exhausted": draw(st.sampled_from(["dead_letter", "compensate"])),
        "group_limit": draw(st.sampled_from(CONCURRENCY)),
        "map_limit": draw(st.sampled_from(CONCURRENCY)),
        "items": draw(st.integers(0, 5)),
        "do": {key: draw(likely_ok) for key in KEYS},
        "undo": {key: draw(st.one_of(st.just(["ok"]), undo_scripts)) for key in KEYS},
        "operations": draw(
            st.lists(
                st.one_of(
                    st.tuples(st.just("cancel"), st.just(0)),
                    st.tuples(st.just("advance"), st.integers(0, 25)),
                    st.tuples(st.just("idle"), st.just(0)),
                    st.tuples(st.just("step"), st.integers(1, 6)),
                ),
                max_size=4,
            )
        ),
        "operator": draw(st.lists(st.sampled_from(["retry", "cancel"]), max_size=2)),
        "order": draw(st.randoms(use_true_random=False)),
    }


def definition_of(world: dict[str, Any]) -> Saga[Order]:
    if world["race"]:
        return race_saga(world["group_limit"])
    return fan_saga(world["on_exhausted"], world["group_limit"], world["map_limit"])


class CheckingRunner(SagaRunner):
    """Checks the concurrency limit after every decision (branches sent and not ended)."""

    limits: dict[str, int | None]

    def _commit(self, record: Any, decision: Any, event: Any) -> None:
        super()._commit(record, decision, event)
        state = decision.state
        for name, limit in self.limits.items():
            if limit is None or name not in state.steps:
                continue
            busy = [
                k
                for k, r in state.branches.items()
                if k.startswith(f"{name}#") and r.status in ("dispatched", "retrying")
            ]
            assert len(busy) <= limit, f"{name}: {len(busy)} branches in flight, limit {limit}"


def play(world: dict[str, Any]) -> tuple[SagaRunner, str]:
    participant = FakeParticipant(
        "p",
        {
            Do: by_key(world["do"], Done, ["ok"]),
            Undo: by_key(world["undo"], Done, ["ok"]),
        },
    )
    definition = definition_of(world)
    limits = {"g": world["group_limit"], "q": world["group_limit"], "m": world["map_limit"]}
    runner = CheckingRunner(definition, participants=[participant], reorder=world["order"])
    runner.limits = limits
    saga_id = runner.start(Order(items=world["items"]))
    for op, arg in world["operations"]:
        if op == "cancel":
            runner.cancel(saga_id)
        elif op == "advance":
            runner.advance(seconds=arg)
        elif op == "step":
            runner._max_deliveries, saved = arg, runner._max_deliveries  # deliver a few, then act
            with contextlib.suppress(RunnerError):  # "still busy": the point was to stop midway
                runner.run_until_idle()
            runner._max_deliveries = saved
        else:
            runner.run_until_idle()
    runner.run_until_settled()
    for action in world["operator"]:
        if runner.status(saga_id) == SagaStatus.DEAD_LETTERED:
            (runner.retry if action == "retry" else runner.cancel)(saga_id)
        runner.run_until_settled()
    return runner, saga_id


def check(world: dict[str, Any], runner: SagaRunner, saga_id: str) -> None:
    runner.assert_invariants()  # G2-G4 incl. branches, lifecycle, nothing sent after success
    state = runner.state(saga_id)
    cancelled = " after a cancel" if state.cancel else ""
    event(f"{'race' if world['race'] else 'fan'} ended {state.status}{cancelled}")
    assert state.status in SETTLED, f"stuck in {state.status}"
    if state.status == SagaStatus.DEAD_LETTERED:
        assert state.error is not None
    check_fan_in(runner, saga_id)
    check_compensations(runner, saga_id)
    check_late_replies(runner, saga_id)


def check_fan_in(runner: SagaRunner, saga_id: str) -> None:
    """Fan-in exactly once, and only when the group is done."""
    state = runner.state(saga_id)
    history = runner.history(saga_id)
    for group_name in ("g", "m", "q"):
        if group_name not in state.steps:
            continue
        assert state.completed.count(group_name) <= 1
        group = state.steps[group_name].group
        if group_name in state.completed:
            assert group is not None
            keys = [f"{group_name}#{i}" for i in range(group.total)]
            if group_name == "q":
                assert state.branches[f"q#{group.winner}"].seq == 1  # the first to succeed won
            else:
                assert all(state.branches[k].seq > 0 for k in keys), "fan-in before every branch succeeded"
    sent_b = [e for entry in history for e in entry.effects if isinstance(e, Dispatch) and e.step == "b"]
    assert len([e for e in sent_b if e.kind == "do" and e.attempt == 1]) <= 1, (
        "the step after the groups was sent twice"
    )


def check_compensations(runner: SagaRunner, saga_id: str) -> None:
    """Compensations: exactly the completed steps and branches, latest completion first."""
    state = runner.state(saga_id)
    definition = runner.registry.latest(state.name)
    history = runner.history(saga_id)
    calls = [c for c in runner.calls if c.saga_id == saga_id]
    done = Counter(c.step for c in calls if c.kind == "do" and c.applied)
    undone = [c.step for c in calls if c.kind == "undo" and c.applied]
    assert len(undone) == len(set(undone)), f"undone twice: {undone}"
    for key in [*state.completed, *state.branches]:
        if key in ("g", "m", "q"):
            continue
        record = state.steps.get(key) or state.branches[key]
        if record.seq or key in state.completed:
            assert done[key] == 1, f"{key} completed with {done[key]} effects"
    order = completion_order(definition, state)
    cleanup = _forward_undos(history)  # first-of-N losers undone before the saga went on
    assert all(k.startswith("q#") for k in cleanup)
    saga_undos = [k for k in undone if k not in cleanup]
    expected = [k for k in reversed(order) if k not in cleanup]
    assert saga_undos == expected[: len(saga_undos)], (saga_undos, expected)
    if state.status in (SagaStatus.COMPENSATED, SagaStatus.CANCELLED):
        assert saga_undos == expected
    if state.status in (SagaStatus.COMPLETED, SagaStatus.FAILED):
        assert saga_undos == []


def check_late_replies(runner: SagaRunner, saga_id: str) -> None:
    """Replay is exact; late and repeated replies and timers change nothing."""
    state = runner.state(saga_id)
    definition = runner.registry.latest(state.name)
    history = runner.history(saga_id)
    assert runner.replay(saga_id) == state
    for entry in history:
        if isinstance(entry.event, StepReplied | TimerFired):
            again = decide(definition, state, entry.event)
            assert again.ignored, f"{entry.event} was applied twice"
            assert again.effects == []
    never = [
        k
        for g in ("g", "m", "q")
        if g in state.steps and (grp := state.steps[g].group) is not None
        for k in (f"{g}#{i}" for i in range(grp.started, grp.total))
    ]
    for key in never:  # a reply for a branch that never started (cancelled before dispatch)
        stray = StepReplied(
            id="stray",
            at_ms=state.updated_ms,
            step=key,
            kind="do",
            attempt=1,
            command_id="x",
            ok=True,
            output=msgspec.Raw(b'{"type":"Done","key":"x"}'),
        )
        assert decide(definition, state, stray).ignored


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(world=worlds())
def test_any_mix_of_branch_outcomes_and_orderings_ends_well(world: dict[str, Any]) -> None:
    runner, saga_id = play(world)
    check(world, runner, saga_id)


def test_the_checks_catch_a_decider_that_undoes_branches_in_completion_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import saga.core.group_rules as groups

    real = groups.GroupRules.next_undo

    def oldest_first(self: Any, group: str, *, skip: int = -1) -> str | None:
        latest = real(self, group, skip=skip)
        if latest is None:
            return None
        done = [
            (r.seq, k)
            for k, r in self.run.state.branches.items()
            if k.startswith(f"{group}#")
            and r.status == "succeeded"
            and r.seq
            and self.run.definition.step_named(k).compensation is not None
        ]
        return min(done)[1]

    monkeypatch.setattr(groups.GroupRules, "next_undo", oldest_first)
    world = {
        "race": False,
        "on_exhausted": "compensate",
        "group_limit": None,
        "map_limit": None,
        "items": 3,
        "do": {"b": ["permanent"]},
        "undo": {},
        "operations": [],
        "operator": [],
        "order": random.Random(0),
    }
    runner, saga_id = play(world)
    with pytest.raises(AssertionError, match="compensations sent in order"):
        check(world, runner, saga_id)
