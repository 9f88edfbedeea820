"""Open human tasks for the ``saga tasks`` tests: the refund saga of the task-inbox tests,
its worker on a fake clock, and the application's authorizer (``--authorizer`` names it)."""

from __future__ import annotations

import anyio

import bus
from bus import FakeClock
from saga import App, EngineConfig, SagaClient, SagaWorker
from saga.runtime.task_client import TaskClient
from saga.runtime.tasks import role_table
from tests.saga.task_sagas import Refund, refund

AUTHORIZER = "tests.cli.task_world:authorize"
authorize = role_table({"managers": {"ann", "bob"}, "leads": {"lee"}}, supervisors="leads")
"""Ann and Bob are managers; Lee, a lead, may reassign any task."""
app = App("refunds", sagas=[refund])
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))
CLOCK_MS = 1_800_000_000_000


def worker(redis: bus.Redis) -> SagaWorker:
    """The refunds worker, on a fake clock that does not move."""
    return SagaWorker(redis, app, config=CONFIG, clock=FakeClock(CLOCK_MS), consumer="tasks-cli")


async def open_tasks(redis: bus.Redis, *amounts: int) -> list[str]:
    """Start one refund per amount and run the worker until each waits for a manager; the task ids."""
    runner = worker(redis)
    await runner.register()
    client = SagaClient(redis, app.registry, clock=FakeClock(CLOCK_MS), config=CONFIG)
    for amount in amounts:
        await client.start(refund, Refund(id=f"r{amount}", amount=amount), saga_id=f"r{amount}")
    with anyio.fail_after(30):
        await runner.run_until_idle()
    tasks = TaskClient(redis, app.registry, authorize=authorize, config=CONFIG)
    found = {t.saga_id: t.id for t in await tasks.list(role="managers")}
    return [found[f"r{amount}"] for amount in amounts]


async def settle(redis: bus.Redis) -> None:
    """Run the worker until idle (the sagas see the answers given)."""
    with anyio.fail_after(30):
        await worker(redis).run_until_idle()
