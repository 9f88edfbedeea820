"""An escalation step fires once with two workers running side by side on a real clock.

Both workers read the task's due timer before either fires it (a gate holds each one's first
read of it until the other has read it too, which is what two workers waking at the due time
do): the first escalates the task (reassigns and extends it), and the second firing of the
same timer must then change nothing. The task fails only at the extended due time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import anyio
import msgspec
import pytest

import bus
from saga import App, EngineConfig, Saga, SagaClient, SagaStatus, SagaWorker
from saga.core import task_rules as rules
from saga.core.task_rules import Task
from saga.definition.human_tasks import Escalation, Role, User
from saga.runtime.task_client import TaskClient
from saga.runtime.tasks import role_table
from saga.store.keys import Partition
from tests.helpers import eventually

pytestmark = pytest.mark.anyio
CONFIG = EngineConfig(
    bus=bus.BusConfig(lease_ms=10_000, block_ms=50), signal_secret="a test secret of at least sixteen bytes"
)


class Payout(msgspec.Struct, frozen=True):
    id: str


class Approval(msgspec.Struct, frozen=True):
    approved: bool


payout = Saga("payout", version=1, context="payouts", data=Payout)
approve = payout.human_task(
    "approve",
    title="Approve the payout",
    form=Approval,
    assignee=Role("managers"),
    due=timedelta(seconds=2),
    escalation=Escalation(reassign_to=User("boss"), extend=timedelta(seconds=30), notify=False),
)


@payout.action()
async def pay(data: Payout, ctx: object) -> str:
    return f"paid {data.id}"


APP = App("payouts", sagas=[payout])


class Gate:
    """Holds each worker's first read of a due escalation timer until both workers have read it."""

    def __init__(self) -> None:
        self.readers: set[str] = set()
        self.both_read = anyio.Event()
        self.rounds_after: dict[str, int] = {}

    def hold(self, worker: SagaWorker, name: str) -> None:
        store, engine = worker.tasks.store, worker.tasks
        read: Callable[..., Awaitable[list[tuple[str, int]]]] = store.due_timers
        fire: Callable[..., Awaitable[int]] = engine.fire_due

        async def due_timers(partition: Partition, now_ms: int, limit: int) -> list[tuple[str, int]]:
            found = await read(partition, now_ms, limit)
            if any(member.endswith("|due") for member, _ in found) and not self.both_read.is_set():
                self.readers.add(name)
                if len(self.readers) == 2:
                    self.both_read.set()
                await self.both_read.wait()
            return found

        async def fire_due(*args: object, **kwargs: object) -> int:
            after = self.both_read.is_set()
            fired = await fire(*args, **kwargs)
            if after:  # a whole round that began once both had read the due timer
                self.rounds_after[name] = self.rounds_after.get(name, 0) + 1
            return fired

        store.due_timers = due_timers  # type: ignore[method-assign]
        engine.fire_due = fire_due  # type: ignore[method-assign]


async def test_an_escalation_step_fires_once_with_two_workers_side_by_side(real_redis: bus.Redis) -> None:
    workers = {name: SagaWorker(real_redis, APP, config=CONFIG, consumer=name) for name in ("w1", "w2")}
    gate = Gate()
    for name, worker in workers.items():
        gate.hold(worker, name)
    client = SagaClient(real_redis, APP.registry, config=CONFIG)
    tasks = TaskClient(real_redis, APP.registry, authorize=role_table({"managers": {"ann"}}), config=CONFIG)
    async with anyio.create_task_group() as tg:
        for worker in workers.values():
            tg.start_soon(worker.run)
        saga_id = await client.start(payout, Payout(id="p1"), saga_id="p1")
        await eventually(gate.both_read.is_set, 30, "both workers read the due timer")
        # the first round each worker began after both had read it: every firing is done
        await eventually(lambda: len(gate.rounds_after) == 2, 30, "both workers fired what they read")
        log = [entry.action for entry in await tasks.log(saga_id)]
        state = await client.get(saga_id)
        for worker in workers.values():
            worker.stop()
    assert log == ["opened", "escalation: reassigned", "escalation: extended"]
    assert state.status == SagaStatus.SUSPENDED
    [task] = await tasks.list(user="boss")
    assert task.state == "open"


def test_a_second_firing_of_the_due_timer_after_the_escalation_changes_nothing_but_the_timer() -> None:
    """The pure rule: the due stage of an escalated task is a repeat; only "final" may end it."""
    task = Task(
        id="t1", context="payouts", partition=0, saga_id="p1", saga="payout@1", step="approve", n=1,
        title="t", details=msgspec.Raw(b"null"), form="f", assignee="role:managers", due_ms=2_000,
        created_ms=0, token="tok", escalate_to="user:boss", extend_ms=30_000, rev=1,
    )  # fmt: skip
    failed = default = msgspec.Raw(b"null")
    first = rules.fired(task, "due", 2_000, failed=failed, default=default)
    assert [entry.action for entry in first.log] == ["escalation: reassigned", "escalation: extended"]
    again = rules.fired(first.task, "due", 2_000, failed=failed, default=default)
    assert (again.log, again.outgoing, again.timers) == ([], [], {})
    assert again.untimers == [rules.timer_member("t1", "due")]
    assert again.task.state == "open"
    assert again.task.due_ms == 32_000
    final = rules.fired(again.task, "final", 32_000, failed=failed, default=default)
    assert [entry.action for entry in final.log] == ["escalation: failed"]
