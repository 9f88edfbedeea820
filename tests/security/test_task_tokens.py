"""Human tasks' resume tokens on a real ``redis-server``, each process its own generated ACL
user and keyring: the token goes only to the task inbox (in the orchestrator's worker) and
the task client. The read-only operator reads none of it, through Redis, ``inspect``,
``export`` or the UI; and a client keyring holding a leaked token cannot answer the task
past the task client's authorizer and claim: ``saga signal`` is refused.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import httpx
import msgspec
import pytest
from redis import exceptions as rx
from structlog.testing import capture_logs
from typer.testing import CliRunner

import bus
from bus import Authenticator, BusConfig, FakeClock
from bus.lowlevel import KEYRING_ENV, encode_keyrings
from redsaga.cli.main import app as cli
from saga import App, EngineConfig, SagaClient, SagaStatus, SagaWorker, TaskClient
from saga.core.task_rules import Task
from saga.errors import NotAuthorized
from saga.ops.admin import SagaAdmin
from saga.ops.keyrings import issue_keyrings
from saga.ops.ui import create_app
from saga.ops.ui.formatting import saga_href
from saga.runtime.tasks import role_table
from saga.store.keys import Partition
from saga.store.tasks import RedisTaskStore
from tests.faults.servers import PrivateRedis
from tests.saga.task_sagas import Approval, Refund, refund
from tests.security.acl_users import Users, applied

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
REFUNDS = Partition("refunds", 0)
APP = App("refunds", sagas=[refund])
MANAGERS = role_table({"managers": {"ann", "mallory"}})
ONLY_ANN = role_table({"managers": {"ann"}})


@dataclass
class Opened:
    """A refund waiting for a manager, its task claimed by ann; ``token`` as the admin reads it."""

    users: Users
    worker: SagaWorker
    tasks: TaskClient
    task: Task
    token: str


@pytest.fixture
async def opened(private_redis_server: PrivateRedis) -> AsyncIterator[Opened]:
    async with open_refund(private_redis_server) as opened:
        yield opened


@asynccontextmanager
async def open_refund(private_redis_server: PrivateRedis) -> AsyncIterator[Opened]:
    """A refund's task opened and claimed by ann, each process its own ACL user and keyring."""
    async with applied(private_redis_server, APP) as users:
        both = issue_keyrings(users.master, users.reach, ["orchestrator:refunds", "participant:tasks"])
        config = EngineConfig(bus=BusConfig(lease_ms=5_000), auth=Authenticator(both))
        worker = SagaWorker(
            users.client("redsaga.refunds"), APP, config=config, clock=FakeClock(1_800_000_000_000)
        )
        await worker.register()
        web = SagaClient(users.client("redsaga.client"), APP.registry, config=users.config("client:web"))
        await web.start(refund, Refund(id="r1", amount=500), saga_id="r1", wait_s=0)
        with anyio.fail_after(30):
            await worker.run_until_idle()  # the task inbox opens the task
        tasks = await TaskClient.from_redis(
            users.client("redsaga.tasks"), authorize=ONLY_ANN, config=users.config("client:web")
        )
        [task] = await tasks.list(role="managers")
        await tasks.claim(task.id, by="ann")
        # an earlier release kept the token in the task's record; this one keeps it apart
        token = task.token or await RedisTaskStore(users.admin).token(REFUNDS, task.id)
        assert token.count(".") == 2
        yield Opened(users, worker, tasks, task, token)


async def _everything_readable(
    redis: bus.Redis, admin: bus.Redis, keys: list[bytes]
) -> tuple[bytes, list[bytes]]:
    """What ``redis`` reads of ``keys`` (each as its type is read), and the keys it is refused."""
    seen, refused = b"", []
    for key in keys:
        kind = (await admin.type(key)).decode()
        read = {
            "hash": redis.hgetall,
            "stream": redis.xrange,
            "list": lambda k: redis.lrange(k, 0, -1),
            "zset": lambda k: redis.zrange(k, 0, -1),
            "set": redis.smembers,
            "string": redis.get,
        }[kind]
        try:
            seen += repr(await read(key)).encode()
        except rx.NoPermissionError:
            refused.append(key)
    return seen, refused


async def test_the_read_only_operator_reads_no_task_token(opened: Opened) -> None:
    signature = opened.token.rpartition(".")[2].encode()
    operator = opened.users.client("redsaga.operator")
    keys = sorted(await opened.users.admin.keys("rs*"))
    everything, refused = await _everything_readable(operator, opened.users.admin, keys)
    assert signature not in everything  # the task, the saga, its input, the command stream
    assert refused == [REFUNDS.task_tokens.encode()]

    admin = SagaAdmin(operator, APP)
    found = await admin.inspect("r1", history=True)
    assert found.task is not None
    assert (found.task.token, found.task.token_expires_ms) == (True, 0)  # it exists, never expires
    assert "its resume token is held by the task inbox and never expires" in found.waiting_for
    assert signature not in msgspec.json.encode(found)
    assert signature not in msgspec.json.encode(await admin.export("r1"))
    ui = httpx.AsyncClient(transport=httpx.ASGITransport(create_app(operator)), base_url="http://127.0.0.1")
    async with ui:
        page = await ui.get(saga_href("r1"))
        assert page.status_code == 200
        assert signature.decode() not in page.text
        assert "resume token is held by the task inbox" in page.text
    denied = [(d["object"], d["username"]) for d in await opened.users.denials()]
    assert denied == [(REFUNDS.task_tokens, "redsaga.operator")]  # the probe above, nothing else


async def test_a_leaked_token_cannot_answer_a_task_past_the_authorizer(opened: Opened) -> None:
    """mallory, refused by the authorizer while ann holds the claim, tries the bare signal."""
    users, task = opened.users, opened.task
    mallory = SagaClient(users.client("redsaga.client"), APP.registry, config=users.config("client:web"))
    inbox = await users.admin.xlen(REFUNDS.inbox.key)
    with pytest.raises(NotAuthorized, match="past the authorizer \\(use `saga tasks complete`\\)") as refused:
        await mallory.signal(opened.token, {"answer": {"approved": True}, "by": "mallory"}, by="mallory")
    assert (refused.value.task, refused.value.by) == (task.id, "mallory")
    assert await users.admin.xlen(REFUNDS.inbox.key) == inbox  # nothing was sent

    url = users.server.url.replace("redis://", "redis://redsaga.client:pw-redsaga.client@")
    keyring = issue_keyrings(users.master, users.reach, ["client:web"])
    env = {KEYRING_ENV: encode_keyrings(keyring).decode(), bus.URL_ENV: url}
    result = await anyio.to_thread.run_sync(
        lambda: CliRunner().invoke(cli, ["signal", opened.token, "--by", "mallory", "--data", "{}"], env=env)
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1
    assert "'mallory' may not answer through `saga signal`, past the authorizer" in result.stderr
    assert opened.token not in result.output
    assert await users.admin.xlen(REFUNDS.inbox.key) == inbox

    with anyio.fail_after(30):
        await opened.worker.run_until_idle()
    assert (await opened.tasks.show(task.id)).holder_at(0) == "ann"
    assert (await mallory.get("r1")).status == SagaStatus.SUSPENDED
    await opened.tasks.complete(task.id, Approval(approved=True), by="ann")  # the task path
    with anyio.fail_after(30):
        await opened.worker.run_until_idle()
    assert (await mallory.get("r1")).status == SagaStatus.COMPLETED
    log = [(e.action, e.by) for e in await opened.tasks.log("r1")]
    assert log == [("opened", "engine"), ("claimed", "ann"), ("completed", "ann")]
    assert await RedisTaskStore(users.admin).token(REFUNDS, task.id) == ""  # forgotten once closed


async def test_no_log_line_holds_a_task_token(private_redis_server: PrivateRedis) -> None:
    """Every line logged at any level while a task opens, is refused to mallory, answered
    by ann and closed: none holds the token (nor its signature alone)."""
    with capture_logs() as logs:
        async with open_refund(private_redis_server) as opened:
            web = SagaClient(
                opened.users.client("redsaga.client"), APP.registry, config=opened.users.config("client:web")
            )
            with pytest.raises(NotAuthorized):
                await web.signal(opened.token, {"answer": {"approved": True}, "by": "mallory"}, by="mallory")
            await opened.tasks.complete(opened.task.id, Approval(approved=True), by="ann")
            with anyio.fail_after(30):
                await opened.worker.run_until_idle()
            assert (await web.get("r1")).status == SagaStatus.COMPLETED
            signature = opened.token.rpartition(".")[2]
    assert len(logs) > 5, "the lifecycle logs something (else this test checks nothing)"
    logged = repr(logs)
    assert opened.token not in logged
    assert signature not in logged
