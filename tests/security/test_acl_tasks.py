"""The task inbox under the generated ACL users, on a real ``redis-server``: the orchestrator's
worker opens tasks (the built-in ``tasks`` participant runs as its user), the task client
claims and completes them, the read-only operator reads them, and each can do no more."""

from __future__ import annotations

import anyio
import pytest
from redis import exceptions as rx

from bus import Authenticator, BusConfig, FakeClock, RedisPermissionDenied
from saga import App, EngineConfig, SagaClient, SagaStatus, SagaWorker, TaskClient
from saga.ops.keyrings import issue_keyrings
from saga.runtime.tasks import role_table
from saga.store.commit import TRANSITION
from saga.store.keys import Partition
from saga.store.scripts import TASK_WRITE
from tests.faults.servers import PrivateRedis
from tests.saga.task_sagas import Approval, Refund, refund
from tests.security.acl_users import applied

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
REFUNDS = Partition("refunds", 0)
APP = App("refunds", sagas=[refund])
MANAGERS = role_table({"managers": {"ann"}})


async def denied(call: object) -> None:
    with pytest.raises(rx.NoPermissionError):
        await call  # type: ignore[misc]


async def test_each_task_principal_does_its_job_and_no_more(private_redis_server: PrivateRedis) -> None:
    async with applied(private_redis_server, APP) as users:
        clock = FakeClock(1_800_000_000_000)
        orchestrator = users.client("redsaga.refunds")
        both = issue_keyrings(users.master, users.reach, ["orchestrator:refunds", "participant:tasks"])
        config = EngineConfig(bus=BusConfig(lease_ms=5_000), auth=Authenticator(both))
        worker = SagaWorker(orchestrator, APP, config=config, clock=clock)  # it runs the task inbox too
        await worker.register()
        web = SagaClient(users.client("redsaga.client"), APP.registry, config=users.config("client:web"))
        for n in (1, 2):
            await web.start(
                refund, Refund(id=f"r{n}", amount=500 * n), saga_id=f"r{n}", wait_s=0
            )  # start requests
        with anyio.fail_after(30):
            await worker.run_until_idle()  # the tasks participant opens the task as the orchestrator

        as_tasks = users.client("redsaga.tasks")
        tasks = await TaskClient.from_redis(as_tasks, authorize=MANAGERS, config=users.config("client:web"))
        task, other = sorted(await tasks.list(role="managers"), key=lambda t: t.saga_id)
        await tasks.claim(task.id, by="ann")
        await tasks.complete(task.id, Approval(approved=True), by="ann")
        with anyio.fail_after(30):
            await worker.run_until_idle()
        assert (await web.get("r1")).status == SagaStatus.COMPLETED

        as_operator = users.client("redsaga.operator")
        reader = await TaskClient.from_redis(as_operator, authorize=MANAGERS)
        assert (await reader.show(task.id)).state == "completed"
        assert [e.action for e in await reader.log("r1")] == ["opened", "claimed", "completed"]
        assert [t.id for t in await reader.list(role="managers")] == [other.id]
        assert await users.denials() == []  # every job above ran within its user's grants

        # the task client reaches no saga, history or stream but the inbox, which it only adds to
        await denied(as_tasks.hgetall(REFUNDS.saga("r1")))
        await denied(as_tasks.lrange(REFUNDS.history("r1"), 0, -1))
        await denied(as_tasks.xrange(REFUNDS.inbox.key))
        await denied(as_tasks.xtrim(REFUNDS.inbox.key, maxlen=0))
        await denied(as_tasks.xadd(REFUNDS.commands("tasks").key, {"f": "v"}))
        await denied(as_tasks.delete(REFUNDS.task(task.id)))
        await denied(as_tasks.fcall(TRANSITION.function, 1, REFUNDS.saga("r1")))
        # the operator reads the inbox but writes no task
        await denied(as_operator.hset(REFUNDS.task(task.id), "rev", "0"))
        await denied(
            as_operator.fcall(TASK_WRITE.function, 3, REFUNDS.task(task.id), REFUNDS.task_timers, "x")
        )
        with pytest.raises(RedisPermissionDenied, match="saga acl"):
            await reader.claim(other.id, by="ann")  # allowed by the authorizer, refused by Redis
        # the saga client never reads a task (it holds the resume token)
        as_client = users.client("redsaga.client")
        await denied(as_client.hget(REFUNDS.task(task.id), "task"))
        await denied(as_client.zrange(REFUNDS.tasks_for("role:managers"), 0, -1))
        assert (await tasks.show(other.id)).rev == other.rev  # nothing of the refused was written
