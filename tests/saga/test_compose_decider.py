"""Composed steps, rule by rule: definitions that fail fast, and the decider's edge cases."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from saga import Command, DefinitionError, Saga, SagaStatus, command
from saga.errors import ChildError
from saga.testing import FakeParticipant, RunnerError, SagaRunner, fail_transiently, no_reply, succeed
from tests.saga.compose_sagas import (
    DEFINITIONS,
    Plan,
    Revert,
    Services,
    Work,
    Worked,
    fan,
    parent,
    seats,
)
from tests.saga.purity import check_purity


@pytest.fixture(autouse=True)
def _decisions_leave_their_input_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    check_purity(monkeypatch, __name__)


class Data(msgspec.Struct, frozen=True):
    items: list[int] = msgspec.field(default_factory=list)


class Ping(msgspec.Struct, tag=True, frozen=True):
    n: int = 0


class Pong(msgspec.Struct, tag=True, frozen=True):
    n: int = 0


def ping(_data: Data) -> Command:
    return command("p", Ping())


def fresh(name: str) -> Saga[Data]:
    return Saga(name, context="rules", data=Data)


# -- definitions fail fast ---------------------------------------------------------------------


def test_a_group_without_branches_is_refused() -> None:
    saga = fresh("empty_group")
    saga.parallel("g")
    with pytest.raises(DefinitionError, match=r"empty_group\.g: a parallel group needs at least one branch"):
        saga.validate()


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda s: s.parallel("g", concurrency=0), "concurrency must be a positive integer"),
        (
            lambda s: s.map(items=lambda d: d.items, reply=Pong, limit=0, name="m")(lambda d, i: None),
            "limit must be",
        ),
        (
            lambda s: s.map(items=lambda d: d.items, reply=Pong, name="m")(lambda d: None),
            r"takes \(data, item\)",
        ),
        (lambda s: s.map(items="items", reply=Pong, name="m")(lambda d, i: None), "items must be a function"),
        (
            lambda s: s.tcc(reply=Pong, confirm="x", cancel="x", expires=timedelta(minutes=1))(ping),
            "confirm and cancel must be different",
        ),
        (
            lambda s: s.tcc(reply=Pong, confirm="c", cancel="x", expires=timedelta(0))(ping),
            "expires must be a positive timedelta",
        ),
        (lambda s: s.child("c", saga=s, data=lambda d: d), "a saga cannot be its own child"),
        (lambda s: s.child("c", saga="other", data=lambda d: d), "saga= must be a Saga definition"),
    ],
)
def test_composed_steps_check_their_arguments(declare: Any, message: str) -> None:
    with pytest.raises(DefinitionError, match=message) as caught:
        declare(fresh("bad"))
    assert caught.value.saga == "bad"
    assert caught.value.step in ("g", "m", "ping", "c")
    assert str(caught.value) == f"bad.{caught.value.step}: {caught.value.reason}"


def test_branch_names_are_unique_across_the_saga() -> None:
    saga = fresh("names")
    saga.step(reply=Pong, name="a")(ping)
    group = saga.parallel("g")
    with pytest.raises(DefinitionError, match=r"names\.a: a step with this name is already declared"):
        group.step(reply=Pong, name="a")(ping)


def test_a_command_branch_must_be_a_plain_function() -> None:
    group = fresh("async_branch").parallel("g")

    async def builder(_data: Data) -> Command:
        return command("p", Ping())

    with pytest.raises(DefinitionError, match="must be a plain function"):
        group.step(reply=Pong)(builder)


def test_a_tcc_steps_confirmation_must_be_declared() -> None:
    saga = fresh("tcc_missing")
    saga.tcc(reply=Pong, confirm="confirm_it", cancel="cancel_it", expires=timedelta(minutes=1))(ping)
    saga.compensation("cancel_it")(lambda d, ctx: command("p", Ping()))
    with pytest.raises(DefinitionError, match="confirm='confirm_it' names no declared compensation"):
        saga.validate()


# -- the decider's rules -----------------------------------------------------------------------


def services() -> Services:
    async def cancel(_saga_id: str) -> None:
        return None

    return Services(cancel)


def test_each_branch_has_its_own_idempotency_key_and_knows_its_index() -> None:
    worker = FakeParticipant.of(services().build())
    runner = SagaRunner(*DEFINITIONS, participants=[worker])
    runner.run(Plan(id="p", items=["a", "b"]), definition=fan, saga_id="f")
    keys = [(c.step, c.idempotency_key) for c in worker.calls if c.kind == "do"]
    assert ("book#1", "f:book#1:do") in keys
    assert ("item#1", "f:item#1:do") in keys
    assert len({k for _, k in keys}) == len(keys)


def test_a_maps_items_function_that_raises_fails_the_step_for_good() -> None:
    saga = fresh("raising_items")

    def broken(_data: Data) -> list[int]:
        raise RuntimeError("no items today")

    saga.map(items=broken, reply=Pong, name="m")(lambda d, i: command("p", Ping(n=i)))
    runner = SagaRunner(saga, participants=[FakeParticipant("p", {Ping: Pong()})])
    state = runner.run(Data())
    assert state.status == SagaStatus.FAILED
    assert state.error is not None
    assert "items() raised RuntimeError: no items today" in state.error.reason


def test_the_tcc_expiry_counts_from_the_trys_dispatch() -> None:
    worker = FakeParticipant.of(services().build())
    worker.on(Work, no_reply(times=1, then=succeed(lambda c: Worked(piece=c.piece))))
    runner = SagaRunner(*DEFINITIONS, participants=[worker])
    saga_id = runner.start(Plan(id="p", nap=3600), definition=seats, saga_id="s")
    runner.run_until_idle()
    runner.advance(seconds=11)  # the try times out after 10 s ...
    runner.advance(seconds=2)  # ... and is retried after its back-off: it succeeds
    state = runner.state(saga_id)
    assert state.steps["hold_seat"].status == "succeeded"
    [expiry] = [t for t in runner.timers(saga_id) if t.purpose == "expiry"]
    second_try = state.steps["hold_seat"].attempts[1]
    assert expiry.due_ms == second_try.dispatched_ms + 300_000
    runner.advance(minutes=5)
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    assert runner.state(saga_id).error is not None


def test_a_cancel_is_refused_once_the_saga_confirms() -> None:
    worker = FakeParticipant.of(services().build())
    worker.on(Work, succeed(lambda c: Worked(piece=c.piece)))
    from tests.saga.compose_sagas import Confirm

    worker.on(Confirm, no_reply(times=1, then=succeed(lambda c: Worked(piece=c.piece))))
    runner = SagaRunner(*DEFINITIONS, participants=[worker])
    saga_id = runner.start(Plan(id="p"), definition=seats, saga_id="s")
    runner.run_until_idle()
    assert runner.state(saga_id).steps["hold_seat"].status == "confirming"
    runner.cancel(saga_id)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert any("too late to cancel" in e.ignored for e in runner.history(saga_id))


def test_an_operator_force_completes_one_branch_of_a_dead_lettered_group() -> None:
    worker = FakeParticipant.of(services().build())
    runner = SagaRunner(*DEFINITIONS, participants=[worker])
    saga_id = runner.start(Plan(id="p", items=["a"], flaky={"hotel": 9}), definition=fan, saga_id="f")
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.DEAD_LETTERED
    runner.force_complete(saga_id, "book", Worked(piece="by hand"))  # the group itself: refused
    runner.run_until_idle()
    assert "force-complete a branch" in runner.history(saga_id)[-1].ignored
    runner.force_complete(saga_id, "book#1", Worked(piece="hotel"))  # (finish checks the piece)
    runner.run_until_settled()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert state.branches["book#1"].attempts[-1].outcome == "forced"
    runner.assert_invariants()


def test_redrive_does_not_reach_into_a_started_group() -> None:
    from saga.core.redrive import redrive_refusal

    runner = SagaRunner(*DEFINITIONS, participants=[FakeParticipant.of(services().build())])
    runner.start(Plan(id="p", items=["a"], flaky={"hotel": 9}), definition=fan, saga_id="f")
    runner.run_until_settled()
    assert "have started branches" in redrive_refusal(fan, runner.state("f"), "prepare")


def test_a_winner_cancels_the_child_sagas_of_the_other_branches() -> None:
    child: Saga[Plan] = Saga("slow_child", context="rules", data=Plan)

    @child.step(reply=Worked)
    def work_slowly(data: Plan) -> Command:
        return command("slow", Work(piece="slow", saga="", plan=data))

    racing: Saga[Plan] = Saga("racing", context="rules", data=Plan)
    group = racing.first_of("either")
    group.child("via_child", saga=child, data=lambda p: p)

    @group.step(reply=Worked)
    def direct(data: Plan) -> Command:
        return command("fast", Work(piece="fast", saga="", plan=data))

    slow = FakeParticipant("slow", {Work: succeed(lambda c: Worked(piece=c.piece)), Revert: succeed()})
    fast = FakeParticipant("fast", {Work: succeed(lambda c: Worked(piece=c.piece))})
    runner = SagaRunner(racing, child, participants=[slow, fast])
    runner.pause("slow")  # the child's step is in flight when the direct branch wins
    runner.start(Plan(id="r"), definition=racing, saga_id="r")
    runner.run_until_idle()
    assert runner.state("r/either#0").cancel is not None  # the winner cancelled the child
    assert runner.status("r") == SagaStatus.RUNNING  # waiting for the child's end
    runner.resume("slow")
    runner.run_until_settled()
    state = runner.state("r")
    assert state.status == SagaStatus.COMPLETED
    assert state.steps["either"].group is not None
    assert state.steps["either"].group.winner == 1
    assert runner.status("r/either#0") == SagaStatus.CANCELLED  # cancelled while its step was in flight
    assert state.branches["either#0"].status == "failed"
    runner.assert_invariants()


def test_a_child_whose_data_does_not_fit_fails_its_parent_step() -> None:
    child: Saga[Data] = Saga("strict_child", context="rules", data=Data)
    child.step(reply=Pong)(ping)
    parent_saga: Saga[Data] = Saga("lenient_parent", context="rules", data=Data)
    parent_saga.child("c", saga=child, data=lambda d: {"items": "not a list"})
    runner = SagaRunner(parent_saga, child, participants=[FakeParticipant("p", {Ping: Pong()})])
    state = runner.run(Data(), definition=parent_saga)
    assert state.status == SagaStatus.FAILED
    assert "InvalidInput: saga strict_child@1: data is not a valid Data" in (
        state.steps["c"].attempts[0].error or ""
    )


def test_a_runner_not_given_the_child_saga_says_which_one_to_add() -> None:
    child: Saga[Data] = Saga("unlisted_child", context="rules", data=Data)
    child.step(reply=Pong)(ping)
    parent_saga: Saga[Data] = Saga("listing_parent", context="rules", data=Data)
    parent_saga.child("c", saga=child, data=lambda d: d)
    runner = SagaRunner(parent_saga, participants=[FakeParticipant("p", {Ping: Pong()})])
    saga_id = runner.start(Data(), definition=parent_saga, saga_id="lp-1")
    with pytest.raises(ChildError, match=r"give the runner the child saga unlisted_child@1 too") as missing:
        runner.run_until_idle()
    assert isinstance(missing.value, RunnerError)
    assert (missing.value.child, missing.value.saga_id) == ("unlisted_child@1", saga_id)


def test_the_parents_cancel_reaches_a_child_in_another_context() -> None:
    runner = SagaRunner(*DEFINITIONS, participants=[FakeParticipant.of(services().build())])
    saga_id = runner.start(Plan(id="p"), definition=parent, saga_id="pp")
    runner._max_deliveries = 3  # reserve, its reply, the child's start: then stop (still busy)
    with contextlib.suppress(RunnerError):
        runner.run_until_idle()
    runner._max_deliveries = 100_000
    assert runner.state("pp/bill").parent is not None
    runner.cancel(saga_id)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.CANCELLED
    assert runner.state("pp/bill").context == "billing"
    assert runner.status("pp/bill") in (SagaStatus.CANCELLED, SagaStatus.COMPENSATED, SagaStatus.COMPLETED)
    runner.assert_invariants()


def test_transient_branch_failures_are_not_retried_once_the_group_closed() -> None:
    worker = FakeParticipant.of(services().build())
    worker.on(Work, fail_transiently(times=1))  # then the real handler: item-a fails for good
    runner = SagaRunner(*DEFINITIONS, participants=[worker])
    runner.run(Plan(id="p", items=["a", "b"], fail=["item-a"]), definition=fan, saga_id="f")
    state = runner.state("f")
    assert state.status == SagaStatus.COMPENSATED
    assert all(r.count("do") <= 3 for r in state.branches.values())
    runner.assert_invariants()
