"""The saga templates: an approval chain through human tasks, and a batch job over chunks."""

from __future__ import annotations

from datetime import timedelta

import anyio
import msgspec
import pytest

import bus
from bus import FakeClock, PermanentError, TransientError
from saga import App, CommandContext, EngineConfig, Participant, SagaClient, SagaStatus, SagaWorker, command
from saga.runtime.protocol import RETRY, OperatorRequest
from saga.runtime.task_client import TaskClient
from saga.runtime.tasks import role_table
from saga.templates import Decision, approval_chain, batch, chunked
from saga.testing import FakeParticipant, SagaRunner, fail_transiently, succeed


class Expense(msgspec.Struct, frozen=True):
    id: str
    amount: int
    approvers: list[str]


class Outbox:
    """Where the approval requests go (an e-mail service, in real life)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []
        self.tokens: dict[str, str] = {}
        self.withdrawn: list[str] = []

    async def ask(self, request: Expense, approver: str, task_id: str) -> None:
        self.asked.append((request.id, approver))
        self.tokens[approver] = task_id

    async def withdraw(self, _request: Expense, approver: str) -> None:
        self.withdrawn.append(approver)


def chain_of(mode: str, outbox: Outbox, name: str = "expense") -> object:
    return approval_chain(
        name,
        request=Expense,
        approvers=lambda e: e.approvers,
        ask=outbox.ask,
        withdraw=outbox.withdraw,
        mode=mode,  # type: ignore[arg-type]
        timeout=timedelta(hours=1),
        context="finance",
    )


EXPENSE = Expense(id="x1", amount=900, approvers=["ann", "bob", "cy"])


def test_a_sequential_chain_asks_one_approver_after_the_other() -> None:
    outbox = Outbox()
    chain = chain_of("sequential", outbox)
    runner = SagaRunner(*chain.definitions)  # type: ignore[attr-defined]
    saga_id = runner.start(EXPENSE, definition=chain.chain)  # type: ignore[attr-defined]
    for approver in ["ann", "bob", "cy"]:
        runner.run_until_idle()
        assert outbox.asked[-1] == ("x1", approver)  # asked only once the one before approved
        runner.tasks.complete(outbox.tokens[approver], Decision(approved=True, by=approver), by=approver)
    runner.run_until_idle()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    decisions = [msgspec.json.decode(bytes(state.branches[f"approvals#{i}"].output)) for i in range(3)]
    assert [d["by"] for d in decisions] == ["ann", "bob", "cy"]
    assert outbox.withdrawn == []
    runner.assert_invariants()


def test_a_rejection_withdraws_the_approvals_given_so_far_newest_first() -> None:
    outbox = Outbox()
    chain = chain_of("sequential", outbox)
    runner = SagaRunner(*chain.definitions)  # type: ignore[attr-defined]
    saga_id = runner.start(EXPENSE, definition=chain.chain)  # type: ignore[attr-defined]
    runner.run_until_idle()
    runner.tasks.complete(outbox.tokens["ann"], Decision(approved=True), by="ann")
    runner.run_until_idle()
    runner.tasks.complete(outbox.tokens["bob"], Decision(approved=False, comment="too much"), by="bob")
    runner.run_until_idle()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPENSATED
    assert [a for _, a in outbox.asked] == ["ann", "bob"]  # cy is never asked
    assert outbox.withdrawn == ["bob", "ann"]  # bob's own request, then ann's approval
    assert "bob rejected the request: too much" in (state.error.reason if state.error else "")
    runner.assert_invariants()


def test_a_parallel_chain_asks_everyone_at_once_and_a_timeout_withdraws() -> None:
    outbox = Outbox()
    chain = chain_of("parallel", outbox, name="expense_all")
    runner = SagaRunner(*chain.definitions)  # type: ignore[attr-defined]
    saga_id = runner.start(EXPENSE, definition=chain.chain)  # type: ignore[attr-defined]
    runner.run_until_idle()
    assert sorted(a for _, a in outbox.asked) == ["ann", "bob", "cy"]
    runner.tasks.complete(outbox.tokens["cy"], Decision(approved=True), by="cy")
    runner.tasks.complete(outbox.tokens["ann"], Decision(approved=True), by="ann")
    runner.run_until_idle()
    runner.advance(hours=2)  # bob never answers
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPENSATED
    assert outbox.withdrawn == ["bob", "ann", "cy"]  # bob's ask; then ann (approved last), cy
    runner.assert_invariants()


def test_a_parallel_chain_completes_whatever_order_the_approvals_come_in() -> None:
    outbox = Outbox()
    chain = chain_of("parallel", outbox, name="expense_any")
    runner = SagaRunner(*chain.definitions)  # type: ignore[attr-defined]
    saga_id = runner.start(EXPENSE, definition=chain.chain)  # type: ignore[attr-defined]
    runner.run_until_idle()
    for approver in ["bob", "cy", "ann"]:
        runner.tasks.complete(outbox.tokens[approver], Decision(approved=True, by=approver), by=approver)
        runner.run_until_idle()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    decisions = [msgspec.json.decode(bytes(state.branches[f"approvals#{i}"].output)) for i in range(3)]
    assert [d["by"] for d in decisions] == ["ann", "bob", "cy"]  # in approver order


# -- batch ------------------------------------------------------------------------------------


class Job(msgspec.Struct, frozen=True):
    id: str
    rows: list[int]
    size: int = 10


class Load(msgspec.Struct, tag=True, frozen=True):
    job: str
    rows: list[int]


class Loaded(msgspec.Struct, tag=True, frozen=True):
    count: int


class Unload(msgspec.Struct, tag=True, frozen=True):
    job: str
    rows: list[int]
    count: int


etl = batch(
    "etl",
    job=Job,
    chunks=lambda job: chunked(job.rows, job.size),
    process=lambda job, rows: command("warehouse", Load(job=job.id, rows=rows)),
    reply=Loaded,
    undo=lambda job, rows, loaded: command("warehouse", Unload(job=job.id, rows=rows, count=loaded.count)),
    concurrency=3,
    timeout=30,
)


def test_chunked_cuts_a_list() -> None:
    assert chunked([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunked([], 3) == []
    with pytest.raises(ValueError, match="at least 1"):
        chunked([1], 0)


def test_a_batch_retries_chunks_on_their_own_and_keeps_at_most_3_in_flight() -> None:
    warehouse = FakeParticipant(
        "warehouse",
        {
            Load: fail_transiently(times=2, then=succeed(lambda c: Loaded(count=len(c.rows)))),
            Unload: succeed(),
        },
    )
    runner = SagaRunner(etl, participants=[warehouse])
    state = runner.run(Job(id="j1", rows=list(range(95))))
    assert state.status == SagaStatus.COMPLETED
    assert [msgspec.json.decode(bytes(state.branches[f"chunks#{i}"].output))["count"] for i in range(10)] == [
        10
    ] * 9 + [5]
    assert [a.outcome for a in state.branches["chunks#4"].attempts] == ["transient", "transient", "ok"]
    loads = [c for c in warehouse.calls if isinstance(c.message, Load)]
    assert len(loads) == 30
    in_flight, most = set(), 0
    for entry in runner.history(state.id):
        for effect in entry.effects:
            if type(effect).__name__ == "Dispatch" and effect.kind == "do":
                in_flight.add(effect.step)
        if entry.event.__class__.__name__ == "StepReplied" and entry.event.ok:
            in_flight.discard(entry.event.step)
        most = max(most, len(in_flight))
    assert most <= 3
    runner.assert_invariants()


def test_a_chunk_that_fails_for_good_undoes_the_chunks_loaded_newest_first() -> None:
    def load(message: Load) -> Loaded:
        if 40 in message.rows:
            raise PermanentError("bad row 40")
        return Loaded(count=len(message.rows))

    warehouse = FakeParticipant("warehouse", {Load: succeed(load), Unload: succeed()})
    runner = SagaRunner(etl, participants=[warehouse])
    state = runner.run(Job(id="j2", rows=list(range(60))))
    assert state.status == SagaStatus.COMPENSATED
    undone = [c.message.rows[0] for c in warehouse.calls if isinstance(c.message, Unload)]
    assert undone == [50, 30, 20, 10, 0]  # 50 was in flight when 40 failed: it loaded, so undone
    loaded = [c.message.rows[0] for c in warehouse.calls if isinstance(c.message, Load)]
    assert loaded == [0, 10, 20, 30, 40, 50]
    runner.assert_invariants()


@pytest.mark.anyio
async def test_a_chunk_out_of_attempts_waits_for_an_operator_then_only_it_is_sent_again(
    redis: bus.Redis,
) -> None:
    clock = FakeClock()
    attempts: dict[int, int] = {}
    warehouse = Participant("warehouse", serves=["batch"])
    broken = {"on": True}

    @warehouse.handles(Load)
    async def load(message: Load, _ctx: CommandContext) -> Loaded:
        first = message.rows[0]
        attempts[first] = attempts.get(first, 0) + 1
        if first == 20 and broken["on"]:
            raise TransientError("warehouse partition offline")
        return Loaded(count=len(message.rows))

    client = SagaClient(redis, App("etl", sagas=[etl]).registry, clock=clock)
    workers = [
        SagaWorker(redis, App("etl", sagas=[etl]), clock=clock),
        SagaWorker(redis, App("wh", participants=[warehouse]), clock=clock),
    ]
    await client.start(etl, Job(id="j3", rows=list(range(50))), saga_id="j3")

    async def settle() -> None:
        with anyio.fail_after(30):
            for _ in range(100):
                for worker in workers:
                    await worker.run_until_idle()
                state = await client.get("j3")
                if state.status in (SagaStatus.DEAD_LETTERED, SagaStatus.COMPLETED):
                    return
                due = await redis.zrange("rs:{batch:0}:timers", 0, 0, withscores=True)
                if due:
                    clock.set(max(int(due[0][1]), clock.now_ms()))

    await settle()
    state = await client.get("j3")
    assert state.status == SagaStatus.DEAD_LETTERED
    assert attempts[20] == 5
    broken["on"] = False
    before = dict(attempts)
    await client.send("j3", RETRY, OperatorRequest(by="ops"))
    await settle()
    state = await client.get("j3")
    assert state.status == SagaStatus.COMPLETED
    assert {k: attempts[k] - before.get(k, 0) for k in attempts} == {0: 0, 10: 0, 20: 1, 30: 0, 40: 0}


@pytest.mark.anyio
async def test_an_approval_chain_on_redis_resumes_through_signed_tokens(redis: bus.Redis) -> None:
    clock = FakeClock()
    outbox = Outbox()
    chain = chain_of("parallel", outbox, name="expense_redis")
    app = App("finance", sagas=chain.definitions)  # type: ignore[attr-defined]
    config = EngineConfig(signal_secret="a secret of sixteen bytes or more")
    worker = SagaWorker(redis, app, clock=clock, config=config)
    client = SagaClient(redis, app.registry, clock=clock, config=config)
    tasks = TaskClient(redis, app.registry, authorize=role_table({}), clock=clock, config=config)
    await client.start(chain.chain, EXPENSE, saga_id="x1")  # type: ignore[attr-defined]
    await worker.run_until_idle()
    assert sorted(outbox.tokens) == ["ann", "bob", "cy"]
    for approver in ["cy", "ann", "bob"]:
        await tasks.complete(outbox.tokens[approver], Decision(approved=True, by=approver), by=approver)
        await worker.run_until_idle()
    state = await client.get("x1")
    assert state.status == SagaStatus.COMPLETED
    assert [msgspec.json.decode(bytes(state.branches[f"approvals#{i}"].output))["by"] for i in range(3)] == [
        "ann",
        "bob",
        "cy",
    ]
