"""The task inbox on real Redis, driven by the saga worker with a fake clock."""

from __future__ import annotations

import anyio
import msgspec
import pytest

import bus
from bus import FakeClock
from saga import App, EngineConfig, SagaClient, SagaWorker
from saga.core.states import SagaStatus
from saga.core.times import utc_text
from saga.definition.human_tasks import User
from saga.errors import InvalidAnswer, NotAuthorized, TaskAlreadyClaimed, TaskClosed
from saga.ops.admin import SagaAdmin
from saga.runtime.task_client import TaskClient
from saga.runtime.tasks import CLAIM_TTL_MS, role_table
from saga.store.keys import Partition, partition_of
from saga.store.tasks import RedisTaskStore
from tests.helpers import while_deciding
from tests.saga.task_sagas import Approval, Refund, lenient, refund
from tests.saga.test_time_faults import SkewedClock

pytestmark = pytest.mark.anyio
CONFIG = EngineConfig(
    bus=bus.BusConfig(lease_ms=10_000), signal_secret="a test secret of at least sixteen bytes"
)
ROLES = {"managers": {"ann", "bob"}, "leads": {"lee"}}
HOUR = 3600.0


class World:
    def __init__(self, redis: bus.Redis) -> None:
        self.clock = FakeClock(1_800_000_000_000)
        self.app = App("refunds", sagas=[refund, lenient])
        self.worker = SagaWorker(redis, self.app, config=CONFIG, clock=self.clock, consumer="w1")
        self.client = SagaClient(redis, self.app.registry, clock=self.clock, config=CONFIG)
        self.tasks = TaskClient(
            redis,
            self.app.registry,
            authorize=role_table(ROLES, supervisors="leads"),
            clock=self.clock,
            config=CONFIG,
        )

    async def idle(self) -> None:
        with anyio.fail_after(30):
            await self.worker.run_until_idle()

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.idle()

    async def started(self, amount: int = 500) -> str:
        saga_id = await self.client.start(refund, Refund(id=f"r{amount}", amount=amount))
        await self.idle()
        return saga_id


async def test_a_task_waits_for_a_manager_and_its_answer_resumes_the_saga(real_redis: bus.Redis) -> None:
    world = World(real_redis)
    saga_id = await world.started()
    assert (await world.client.get(saga_id)).status == SagaStatus.SUSPENDED
    (task,) = await world.tasks.list(role="managers")
    assert task.title == "Approve refund r500 of 500"
    await world.tasks.claim(task.id, by="ann")
    await world.tasks.complete(task.id, Approval(approved=True), by="ann")
    await world.idle()
    state = await world.client.get(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert await world.tasks.list(role="managers") == []
    actions = [(e.action, e.by) for e in await world.tasks.log(saga_id)]
    assert actions == [("opened", "engine"), ("claimed", "ann"), ("completed", "ann")]


async def test_two_clients_race_to_claim_one_task_and_one_wins(real_redis: bus.Redis) -> None:
    world = World(real_redis)
    await world.started()
    (task,) = await world.tasks.list(role="managers")
    other = TaskClient(
        real_redis, world.app.registry, authorize=role_table(ROLES), clock=world.clock, config=CONFIG
    )
    outcomes: list[str] = []

    async def claim(client: TaskClient, who: str) -> None:
        try:
            await client.claim(task.id, by=who)
            outcomes.append(who)
        except TaskAlreadyClaimed as error:
            outcomes.append(f"refused: held by {error.holder}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(claim, world.tasks, "ann")
        tg.start_soon(claim, other, "bob")
    winner = (await world.tasks.show(task.id)).holder
    assert sorted(outcomes) == sorted([winner, f"refused: held by {winner}"])


async def test_a_claim_expires_and_another_manager_takes_the_task(real_redis: bus.Redis) -> None:
    world = World(real_redis)
    await world.started()
    (task,) = await world.tasks.list(role="managers")
    await world.tasks.claim(task.id, by="ann")
    with pytest.raises(TaskAlreadyClaimed):
        await world.tasks.claim(task.id, by="bob")
    world.clock.advance(16 * 60)
    assert (await world.tasks.claim(task.id, by="bob")).holder == "bob"


async def test_an_invalid_answer_is_refused_and_nothing_changes(real_redis: bus.Redis) -> None:
    world = World(real_redis)
    saga_id = await world.started()
    (task,) = await world.tasks.list(role="managers")
    key = Partition("refunds", 0).task(task.id)
    before = await real_redis.hgetall(key)
    with pytest.raises(InvalidAnswer) as refused:
        await world.tasks.complete(task.id, {"approved": "maybe"}, by="ann")
    assert refused.value.form == "Approval"
    assert (await world.tasks.show(task.id)).rev == task.rev
    assert await real_redis.hgetall(key) == before
    with pytest.raises(NotAuthorized):
        await world.tasks.complete(task.id, Approval(approved=True), by="mallory")
    await world.idle()
    assert (await world.client.get(saga_id)).status == SagaStatus.SUSPENDED
    assert [e.action for e in await world.tasks.log(saga_id)] == ["opened"]


async def test_the_reminder_and_each_escalation_step_fire_exactly_once(real_redis: bus.Redis) -> None:
    world = World(real_redis)
    saga_id = await world.started()
    (task,) = await world.tasks.list(role="managers")
    await world.advance(3 * HOUR)  # the reminder is due an hour before the due time
    await world.advance(1 * HOUR)  # due: reassigned to boss, notified, extended by 2 hours
    assert await world.tasks.list(role="managers") == []
    (escalated,) = await world.tasks.list(user="boss")
    assert escalated.due_ms == task.due_ms + 2 * 3_600_000
    second = SagaWorker(real_redis, world.app, config=CONFIG, clock=world.clock, consumer="w2")
    assert await second.fire_tasks() == 0  # nothing fires twice
    await world.advance(2 * HOUR)  # the extension is over: the task fails, the saga compensates
    assert await second.fire_tasks() == 0
    actions = [e.action for e in await world.tasks.log(saga_id)]
    assert actions == [
        "opened",
        "reminded",
        "escalation: reassigned",
        "escalation: notified",
        "escalation: extended",
        "escalation: failed",
    ]
    notices = await real_redis.xrange(escalated_stream(world, saga_id))
    assert [msgspec.json.decode(f[b"data"])["kind"] for _, f in notices] == ["reminder", "escalated"]
    state = await world.client.get(saga_id)
    assert state.status == SagaStatus.COMPENSATED
    with pytest.raises(TaskClosed):
        await world.tasks.claim(task.id, by="boss")


async def test_reassigning_needs_the_assignee_or_a_supervisor_and_a_default_answer_ends_a_task(
    real_redis: bus.Redis,
) -> None:
    world = World(real_redis)
    saga_id = await world.client.start(lenient, Refund(id="small", amount=20))
    await world.idle()
    (task,) = await world.tasks.list(user="ann")
    with pytest.raises(NotAuthorized):
        await world.tasks.reassign(task.id, User("bob"), by="bob")
    await world.tasks.reassign(task.id, User("bob"), by="lee")
    assert [t.id for t in await world.tasks.list(user="bob")] == [task.id]
    await world.advance(HOUR)
    assert (await world.client.get(saga_id)).status == SagaStatus.COMPLETED
    assert (await world.tasks.show(task.id)).answered_by == "escalation"


async def test_task_actions_are_in_the_sagas_timeline_and_trace_and_replay_is_untouched(
    real_redis: bus.Redis,
) -> None:
    world = World(real_redis)
    saga_id = await world.started()
    (task,) = await world.tasks.list(role="managers")
    world.clock.advance(60)
    await world.tasks.claim(task.id, by="ann")
    await world.tasks.complete(task.id, Approval(approved=True), by="ann")
    await world.idle()
    admin = SagaAdmin(real_redis, world.app, clock=world.clock, config=CONFIG)
    found = await admin.inspect(saga_id)
    rows = [(r.source, r.by or r.event) for r in found.timeline]
    tasks = [r for r in found.timeline if r.source == "task"]
    assert [r.summary for r in tasks] == [
        f"task approve: opened by engine (for role:managers, due {utc_text(task.due_ms)})",
        f"task approve: claimed by ann (until {utc_text(world.clock.now_ms() + CLAIM_TTL_MS)})",
        "task approve: completed by ann",
    ]
    # merged by time: the claim and the completion come after the task opened, before the signal
    assert rows.index(("task", "ann")) < rows.index(("history", "signal"))
    assert tasks[1].status == SagaStatus.SUSPENDED
    trace = await admin.export(saga_id)
    assert [(e.action, e.by) for e in trace.tasks] == [
        ("opened", "engine"),
        ("claimed", "ann"),
        ("completed", "ann"),
    ]
    assert len(trace.history) == len(await admin.history(saga_id))  # the history holds decisions only
    assert (await admin.replay(saga_id)).ok


def escalated_stream(_world: World, saga_id: str) -> str:
    return Partition("refunds", partition_of(saga_id, 1)).commands("notices").key


async def test_claims_follow_redis_time_not_a_skewed_client_clock(real_redis: bus.Redis) -> None:
    app = App("refunds", sagas=[refund, lenient])
    config = EngineConfig(signal_secret=CONFIG.signal_secret)
    skew = 2 * 24 * 3_600_000
    worker = SagaWorker(real_redis, app, config=config, clock=SkewedClock(-skew), consumer="w1")
    client = SagaClient(real_redis, app.registry, config=config)
    tasks = TaskClient(
        real_redis, app.registry, authorize=role_table(ROLES), clock=SkewedClock(skew), config=config
    )
    await client.start(refund, Refund(id="skew", amount=500))
    with anyio.fail_after(30):
        await worker.run_until_idle()
    (task,) = await tasks.list(role="managers")
    seconds, micros = await real_redis.time()
    redis_now = int(seconds) * 1000 + int(micros) // 1000
    assert abs(task.created_ms - redis_now) < 60_000  # opened by Redis time, not the worker's
    claimed = await tasks.claim(task.id, by="ann")
    assert abs(claimed.claim_until_ms - (redis_now + CLAIM_TTL_MS)) < 60_000
    with pytest.raises(TaskAlreadyClaimed):  # two days ahead on the client's clock, still held
        await tasks.claim(task.id, by="bob")


async def test_inspect_shows_the_task_a_saga_waits_for_not_its_signal_wait(real_redis: bus.Redis) -> None:
    world = World(real_redis)
    saga_id = await world.started()
    (task,) = await world.tasks.list(role="managers")
    admin = SagaAdmin(real_redis, world.app, clock=world.clock, config=CONFIG)
    found = await admin.inspect(saga_id)
    assert found.task is not None
    assert (found.task.id, found.task.assignee, found.task.due_ms) == (task.id, "role:managers", task.due_ms)
    assert found.waiting_for == (
        f"a person: task 'approve' for role:managers, due {utc_text(task.due_ms)}, unclaimed; at the due "
        "time it goes to user:boss, notices is notified, its due time moves 7200 s later, then it fails; "
        "its resume token is held by the task inbox and never expires"
    )
    assert (found.task.token, found.task.token_expires_ms) == (True, 0)
    token = await RedisTaskStore(real_redis).token(Partition(task.context, task.partition), task.id)
    assert token.startswith("rs2.")
    assert token.encode() not in msgspec.json.encode(found)  # the resume token is a secret
    await world.tasks.claim(task.id, by="ann")
    claimed = await admin.inspect(saga_id)
    until = utc_text(world.clock.now_ms() + CLAIM_TTL_MS)
    assert f", claimed by ann until {until}; at the due time" in claimed.waiting_for


async def test_every_open_task_and_the_overdue_ones_are_listed_without_a_role(real_redis: bus.Redis) -> None:
    world = World(real_redis)
    first = await world.started(500)
    world.clock.advance(HOUR)
    second = await world.started(900)
    assert [t.saga_id for t in await world.tasks.list()] == [first, second]  # soonest due first
    assert await world.tasks.list(overdue=True) == []
    world.clock.advance(3.5 * HOUR)  # no worker runs: nothing escalates, the first is past due
    assert [t.saga_id for t in await world.tasks.list(overdue=True)] == [first]
    world.clock.advance(HOUR)
    assert [t.saga_id for t in await world.tasks.list(overdue=True)] == [first, second]
    assert [t.saga_id for t in await world.tasks.list(role="managers", overdue=True)] == [first, second]


async def test_force_complete_of_a_task_step_answers_it_and_the_saga_goes_on(real_redis: bus.Redis) -> None:
    world = World(real_redis)
    saga_id = await world.started()
    (task,) = await world.tasks.list(role="managers")
    admin = SagaAdmin(real_redis, world.app, clock=world.clock, config=CONFIG, by="oncall")
    done = admin.force_complete(saga_id, "approve", '{"approved": true}', reason="approved by phone")
    result = await while_deciding(world.worker, done)
    assert result.outcome == "applied"
    assert (await world.tasks.show(task.id)).state == "withdrawn"  # nobody answers it again
    assert await world.tasks.list(role="managers") == []
    await world.idle()
    state = await world.client.get(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert bytes(state.steps["pay"].output) == b'"paid 500"'  # type: ignore[arg-type]
