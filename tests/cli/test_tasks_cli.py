"""``saga tasks``: list, show, claim, release, complete and reassign from the command line.

On fakeredis (``bus.connect`` hands the commands a client of one shared embedded server, so
the command line's own checks run as they do on Redis), and once end to end on real Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import fakeredis
import fakeredis.aioredis
import msgspec
import pytest
from typer.testing import CliRunner, Result

import bus
from redsaga.cli.main import app
from saga import SagaClient
from saga.core.states import SagaStatus
from saga.store.keys import Partition
from saga.store.tasks import RedisTaskStore
from tests.cli.task_world import AUTHORIZER, CONFIG, open_tasks, settle
from tests.cli.task_world import app as refunds
from tests.cli.test_errors import one_line_error

runner = CliRunner()
FAKE_URL = "redis://fake.invalid:6379/0"
APP = "tests.cli.task_world:app"


class Fake:
    """One embedded Redis server that every client in the test shares."""

    def __init__(self) -> None:
        self.server = fakeredis.FakeServer(version=(7, 0))

    def client(self, *_args: Any, **_kwargs: Any) -> bus.Redis:
        redis: bus.Redis = fakeredis.aioredis.FakeRedis(server=self.server, protocol=2)
        return redis

    def run(self, job: Any, *args: Any) -> Any:
        async def main() -> Any:
            redis = self.client()
            try:
                return await job(redis, *args)
            finally:
                await redis.aclose()

        return anyio.run(main)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    world = Fake()
    monkeypatch.setattr(bus, "connect", world.client)
    yield world


def saga(*args: str, url: str = FAKE_URL, **env: str) -> Result:
    return runner.invoke(
        app,
        list(args),
        env={"REDSAGA_REDIS_URL": url, "REDSAGA_APP": "", "REDSAGA_TASK_AUTHORIZER": AUTHORIZER, **env},
    )


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def as_json(result: Result) -> Any:
    return msgspec.json.decode(ok(result).stdout)


async def _status(redis: bus.Redis, saga_id: str) -> SagaStatus:
    return (await SagaClient(redis, refunds.registry, config=CONFIG).get(saga_id)).status


def test_a_manager_lists_claims_and_answers_a_task_and_the_saga_resumes(fake: Fake) -> None:
    first, second = fake.run(open_tasks, 500, 900)
    table = ok(saga("tasks", "list", "--role", "managers")).stdout
    assert "Approve refund r500 of 500" in table
    assert "Approve refund r900 of 900" in table
    assert table.index(min(first, second)) < table.index(max(first, second))  # due together: by id
    assert ok(saga("tasks", "claim", first, "--by", "ann")).stdout == f"task {first} claimed by ann\n"
    assert ok(saga("tasks", "list", "--role", "managers")).stdout.count(" ann ") == 1
    done = saga("tasks", "complete", first, "--answer", '{"approved": true}', "--by", "ann")
    assert ok(done).stdout == f"task {first} completed by ann\n"
    fake.run(settle)
    assert fake.run(_status, "r500") == SagaStatus.COMPLETED
    assert [t["id"] for t in as_json(saga("tasks", "list", "--role", "managers", "--json"))] == [second]
    shown = as_json(saga("tasks", "show", first, "--json"))
    assert shown["task"]["state"] == "completed"
    assert shown["task"]["answer"] == {"approved": True}  # checked by the registered schema, kept as given
    assert [(e["action"], e["by"]) for e in shown["log"]] == [
        ("opened", "engine"),
        ("claimed", "ann"),
        ("completed", "ann"),
    ]
    text = ok(saga("tasks", "show", first)).stdout
    assert "completed" in text
    assert "Approve refund r500 of 500" in text
    assert "claimed" in text


def test_json_shapes_and_the_resume_token_is_never_printed(fake: Fake) -> None:
    (task_id,) = fake.run(open_tasks, 500)
    listed = saga("tasks", "list", "--role", "managers", "--json")
    (task,) = as_json(listed)
    assert list(task) == [
        "id", "context", "partition", "saga_id", "saga", "step", "title", "details", "form",
        "assignee", "state", "due_ms", "created_ms", "holder", "claim_until_ms", "escalated",
        "answer", "answered_by", "voters", "quorum", "ballots", "revision",
    ]  # fmt: skip
    assert task["details"] == {"id": "r500", "amount": 500}
    assert (task["holder"], task["claim_until_ms"]) == (None, None)
    claimed = as_json(saga("tasks", "claim", task_id, "--by", "bob", "--json"))
    assert claimed["holder"] == "bob"
    assert claimed["claim_until_ms"] > 0
    assert as_json(saga("tasks", "release", task_id, "--by", "bob", "--json"))["holder"] is None
    moved = as_json(saga("tasks", "reassign", task_id, "--to", "user:ann", "--by", "lee", "--json"))
    assert moved["assignee"] == "user:ann"
    assert [t["id"] for t in as_json(saga("tasks", "list", "--user", "ann", "--json"))] == [task_id]
    assert as_json(saga("tasks", "list", "--user", "ann", "--context", "refunds", "--json")) != []
    one_line_error(
        saga("tasks", "list", "--user", "ann", "--context", "nowhere"),
        1,
        "no context 'nowhere' is registered",
    )
    assert as_json(saga("tasks", "list", "--role", "managers", "--json")) == []
    token = fake.run(_token, task_id)
    assert token.startswith("rs2.")
    for output in (
        listed.stdout,
        saga("tasks", "show", task_id, "--json").stdout,
        saga("tasks", "show", task_id).stdout,
    ):
        assert token not in output


async def _token(redis: bus.Redis, task_id: str) -> str:
    context, partition, _ = task_id.split(":")
    return await RedisTaskStore(redis).token(Partition(context, int(partition)), task_id)


async def _raw_task(redis: bus.Redis, task_id: str) -> bytes:
    context, partition, _ = task_id.split(":")
    raw: bytes = await redis.hget(Partition(context, int(partition)).task(task_id), "task")
    return raw


def test_refusals_are_one_line_exit_1_and_change_nothing(fake: Fake) -> None:
    (task_id,) = fake.run(open_tasks, 500)
    before = fake.run(_raw_task, task_id)
    ok(saga("tasks", "claim", task_id, "--by", "ann"))
    claimed = fake.run(_raw_task, task_id)
    one_line_error(saga("tasks", "claim", task_id, "--by", "bob"), 1, "is claimed by 'ann' until")
    one_line_error(saga("tasks", "claim", task_id, "--by", "mallory"), 1, "'mallory' may not claim task")
    one_line_error(
        saga("tasks", "reassign", task_id, "--to", "user:mallory", "--by", "mallory"), 1, "may not reassign"
    )
    for app_option in ([], ["--app", APP]):  # checked by the registered schema, and by the code's type
        one_line_error(
            saga("tasks", "complete", task_id, "--answer", '{"approved": "yes"}', "--by", "ann", *app_option),
            1,
            "is not a valid",
            "Approval",
        )
    one_line_error(
        saga(
            "tasks",
            "complete",
            task_id,
            "--answer",
            '{"approved": true, "extra": 1}',
            "--by",
            "ann",
            "--app",
            APP,
        ),
        1,
        "is not a valid",
    )
    assert fake.run(_raw_task, task_id) == claimed != before
    one_line_error(
        saga("tasks", "show", "refunds:0:no-such-task"), 1, "no task with id 'refunds:0:no-such-task'"
    )
    one_line_error(saga("tasks", "claim", "nonsense", "--by", "ann"), 1, "no task with id 'nonsense'")
    ok(saga("tasks", "complete", task_id, "--answer", '{"approved": false}', "--by", "ann"))
    one_line_error(saga("tasks", "release", task_id, "--by", "ann"), 1, "is completed")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["list", "--role", "a", "--user", "b"], "give at most one of --role ROLE and --user USER"),
        (["list", "--role", "no spaces"], "role 'no spaces' is not valid"),
        (["claim", "t", "--by", "ann", "--authorizer", ""], "needs the application's authorizer"),
        (["claim", "t", "--by", "ann", "--authorizer", "tests.cli.task_world:CLOCK_MS"], "not an authorizer"),
        (["claim", "t"], "Missing option '--by'"),
        (["complete", "t", "--by", "ann", "--answer", "{"], "Invalid value for '--answer': not JSON"),
        (["complete", "t", "--by", "ann"], "Missing option '--answer'"),
        (["reassign", "t", "--by", "ann", "--to", "group:x"], "'group:x' is not role:NAME or user:NAME"),
        (["reassign", "t", "--by", "ann", "--to", "role:a b"], "role 'a b' is not valid"),
    ],
    ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else None,
)
def test_usage_errors(fake: Fake, args: list[str], expected: str) -> None:
    result = saga("tasks", *args)
    code = 1 if "is not valid" in expected and args[0] == "list" else 2
    one_line_error(result, code, expected)


@pytest.mark.redis
def test_the_whole_round_on_real_redis(real_redis_url: str) -> None:
    async def opened() -> list[str]:
        redis = bus.connect(real_redis_url)
        try:
            await redis.flushdb()
            return await open_tasks(redis, 700)
        finally:
            await redis.aclose()

    (task_id,) = anyio.run(opened)
    (task,) = as_json(saga("tasks", "list", "--role", "managers", "--json", url=real_redis_url))
    assert task["id"] == task_id
    ok(saga("tasks", "claim", task_id, "--by", "bob", url=real_redis_url))
    one_line_error(saga("tasks", "claim", task_id, "--by", "ann", url=real_redis_url), 1, "claimed by 'bob'")
    ok(
        saga(
            "tasks", "complete", task_id, "--answer", '{"approved": true}', "--by", "bob", url=real_redis_url
        )
    )

    async def resumed() -> SagaStatus:
        redis = bus.connect(real_redis_url)
        try:
            await settle(redis)
            return await _status(redis, "r700")
        finally:
            await redis.aclose()

    assert anyio.run(resumed) == SagaStatus.COMPLETED
    log = as_json(saga("tasks", "show", task_id, "--json", url=real_redis_url))["log"]
    assert [e["action"] for e in log] == ["opened", "claimed", "completed"]


def test_without_role_or_user_an_operator_lists_every_open_task(fake: Fake) -> None:
    first, second = fake.run(open_tasks, 500, 900)
    listed = as_json(saga("tasks", "list", "--json"))
    assert sorted(t["id"] for t in listed) == sorted([first, second])
    assert [t["due_ms"] for t in listed] == sorted(t["due_ms"] for t in listed)  # soonest due first
    assert "Approve refund r900 of 900" in ok(saga("tasks", "list")).stdout
    # the tasks fall due in 2027 by the test's clock; Redis's clock says they are not overdue
    assert ok(saga("tasks", "list", "--overdue")).stdout.endswith("\n(none)\n")  # as every empty table


def test_listing_before_any_worker_registered_a_context_says_so(fake: Fake) -> None:
    """An empty list would claim that nobody owes anything; Redis knows no context yet."""
    result = saga("tasks", "list")
    one_line_error(result, 1, "no context is registered in this Redis: no worker has run here yet")
