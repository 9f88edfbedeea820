"""Approval chains on human tasks: k of n, escalation per approver, a chain as a child saga."""

from __future__ import annotations

from datetime import timedelta

import anyio
import msgspec
import pytest

import bus
from bus import FakeClock
from saga import App, EngineConfig, Saga, SagaClient, SagaStatus, SagaWorker
from saga.errors import TaskClosed
from saga.runtime.task_client import TaskClient
from saga.runtime.tasks import role_table
from saga.templates import ApprovalChain, Decision, approval_chain
from saga.testing import SagaRunner
from tests.saga.purity import check_purity
from tests.saga.test_templates import EXPENSE, Expense, Outbox


@pytest.fixture(autouse=True)
def _decisions_leave_their_input_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    check_purity(monkeypatch, __name__)


def signers(outbox: Outbox, name: str = "payment", **options: object) -> ApprovalChain[Expense]:
    return approval_chain(
        name,
        request=Expense,
        approvers=lambda e: e.approvers,
        ask=outbox.ask,
        withdraw=outbox.withdraw,
        timeout=timedelta(hours=1),
        context="finance",
        **options,  # type: ignore[arg-type]
    )


def decisions(output: msgspec.Raw) -> list[str]:
    return [d["by"] for d in msgspec.json.decode(bytes(output))]


def test_two_of_three_release_a_payment_and_the_third_ballot_still_open_is_withdrawn() -> None:
    outbox = Outbox()
    chain = signers(outbox, mode="quorum", quorum=2)
    runner = SagaRunner(*chain.definitions)
    saga_id = runner.start(EXPENSE, definition=chain.chain)
    runner.run_until_idle()
    assert sorted(outbox.asked) == [("x1", "ann"), ("x1", "bob"), ("x1", "cy")]
    task_id = outbox.tokens["ann"]
    assert [t.id for t in runner.tasks(user="bob")] == [task_id]
    runner.tasks.complete(task_id, Decision(approved=True, by="ann"), by="ann")
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.SUSPENDED  # one of two
    assert runner.tasks(user="ann") == []
    runner.tasks.complete(task_id, Decision(approved=True, by="cy"), by="cy")
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert decisions(runner.state(saga_id).steps["approvals"].output) == ["ann", "cy"]
    assert runner.tasks(user="bob") == []  # bob's ballot is withdrawn
    with pytest.raises(TaskClosed):
        runner.tasks.complete(task_id, Decision(approved=True, by="bob"), by="bob")
    assert [(e.action, e.by, e.detail) for e in runner.tasks.log(saga_id)][-2:] == [
        ("completed", "cy", "yes: 2 of 2"),
        ("withdrawn", "engine", "ballot of user:bob: the quorum was reached"),
    ]
    runner.assert_invariants()


def test_a_quorum_that_can_no_longer_be_reached_fails_and_withdraws_every_ask() -> None:
    outbox = Outbox()
    chain = signers(outbox, mode="quorum", quorum=2)
    runner = SagaRunner(*chain.definitions)
    saga_id = runner.start(EXPENSE, definition=chain.chain)
    runner.run_until_idle()
    task_id = outbox.tokens["ann"]
    runner.tasks.complete(task_id, Decision(approved=False), by="ann")
    runner.tasks.complete(task_id, Decision(approved=True), by="bob")
    runner.tasks.complete(task_id, Decision(approved=False), by="cy")
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    assert runner.tasks.show(task_id).state == "failed"
    assert outbox.withdrawn == ["ann", "bob", "cy"]


def test_a_late_approver_is_escalated_to_their_deputy_who_approves() -> None:
    outbox = Outbox()
    chain = signers(outbox, name="expense_deputy", mode="sequential", escalate_to=lambda a: f"{a}-deputy")
    runner = SagaRunner(*chain.definitions)
    saga_id = runner.start(EXPENSE, definition=chain.chain)
    runner.run_until_idle()
    runner.tasks.complete(outbox.tokens["ann"], Decision(approved=True, by="ann"), by="ann")
    runner.run_until_idle()
    runner.advance(minutes=61)  # bob's hour is over: his task moves to his deputy, for another hour
    assert runner.tasks(user="bob") == []
    (moved,) = runner.tasks(user="bob-deputy")
    runner.tasks.complete(moved.id, Decision(approved=True, by="bob-deputy"), by="bob-deputy")
    runner.run_until_idle()
    runner.tasks.complete(outbox.tokens["cy"], Decision(approved=True, by="cy"), by="cy")
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPLETED


def test_an_approval_chain_runs_as_a_child_saga() -> None:
    outbox = Outbox()
    chain = signers(outbox, name="payment_child", mode="quorum", quorum=1)
    payment = Saga("release_payment", version=1, context="finance", data=Expense)
    payment.child("signed", saga=chain.chain, data=lambda e: e)

    @payment.action()
    async def release(_data: Expense, ctx: object) -> str:
        return "released by " + ",".join(d.by for d in ctx.output(signed))  # type: ignore[attr-defined]

    signed = payment.step_named("signed")
    runner = SagaRunner(payment, *chain.definitions)
    saga_id = runner.start(EXPENSE, definition=payment)
    runner.run_until_idle()
    runner.tasks.complete(outbox.tokens["bob"], Decision(approved=True, by="bob"), by="bob")
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert bytes(runner.state(saga_id).steps["release"].output) == b'"released by bob"'


@pytest.mark.anyio
async def test_a_quorum_on_redis_withdraws_the_ballot_still_open(real_redis: bus.Redis) -> None:
    clock = FakeClock()
    outbox = Outbox()
    chain = signers(outbox, name="payment_redis", mode="quorum", quorum=2)
    app = App("finance", sagas=chain.definitions)
    config = EngineConfig(signal_secret="a secret of sixteen bytes or more")
    worker = SagaWorker(real_redis, app, clock=clock, config=config)
    client = SagaClient(real_redis, app.registry, clock=clock, config=config)
    tasks = TaskClient(real_redis, app.registry, authorize=role_table({}), clock=clock, config=config)
    await client.start(chain.chain, EXPENSE, saga_id="p1")
    with anyio.fail_after(30):
        await worker.run_until_idle()
    task_id = outbox.tokens["cy"]

    async def sign(who: str) -> None:
        await tasks.complete(task_id, Decision(approved=True, by=who), by=who)

    async with anyio.create_task_group() as tg:  # two signers at once: both ballots count
        tg.start_soon(sign, "cy")
        tg.start_soon(sign, "ann")
    with anyio.fail_after(30):
        await worker.run_until_idle()
    state = await client.get("p1")
    assert state.status == SagaStatus.COMPLETED
    assert sorted(decisions(state.steps["approvals"].output)) == ["ann", "cy"]
    assert await tasks.list(user="bob") == []
    assert (await tasks.show(task_id)).state == "completed"
    with pytest.raises(TaskClosed):
        await sign("bob")
    log = [(e.action, e.by) for e in await tasks.log("p1")]
    assert log[-1] == ("withdrawn", "engine")
    assert log.count(("completed", "ann")) == log.count(("completed", "cy")) == 1
