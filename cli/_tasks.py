"""``saga tasks list|show|claim|release|complete|reassign``: a thin shell over ``TaskClient``.

The client knows the contexts, their partitions and each form's JSON schema from what the
workers registered in Redis (:meth:`saga.TaskClient.from_redis`), so ``list`` and ``show``
need only a Redis URL; ``--app`` adds the definitions' code, whose types then check answers.
The actions name who acts (``--by``) and are judged by the application's authorizer
(``--authorizer module:attribute``), which the engine asks before it writes, as it does for
the application's own web app; the signal a completion sends is signed as a client, as
``saga signal``'s is. A task's resume token is never printed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
import typer

from redsaga.cli._common import (
    CommandError,
    Json,
    RedisUrl,
    UsageProblem,
    app_option,
    emit_json,
    emit_line,
    emit_table,
    reporting_errors,
    with_redis,
)
from redsaga.cli._format import when
from redsaga.cli._load import load_object
from redsaga.cli._session import definitions
from saga import App, Role, TaskClient, User, Versions
from saga.core.task_rules import Task, TaskLog
from saga.definition.registry import Registry
from saga.errors import InvalidInput
from saga.runtime.tasks import Authorizer, nobody
from saga.store.keys import Partition

AUTHORIZER_ENV = "REDSAGA_TASK_AUTHORIZER"
"""The environment variable ``--authorizer`` reads."""

tasks_app = typer.Typer(
    help="Human tasks: list a role's or a person's open tasks, show one, claim, release, complete "
    "and reassign them. list and show need only a Redis URL; the actions need --by and the "
    "application's --authorizer, which decides before anything is written."
)

TaskId = Annotated[str, typer.Argument(help="The task's id (CONTEXT:PARTITION:UUID, as list prints it).")]
By = Annotated[
    str,
    typer.Option(
        "--by",
        envvar="REDSAGA_OPERATOR",
        help="Who acts (a user name; env REDSAGA_OPERATOR), recorded in the saga's task log.",
        show_default=False,
    ),
]
AuthorizerRef = Annotated[
    str | None,
    typer.Option(
        "--authorizer",
        envvar=AUTHORIZER_ENV,
        metavar="MODULE:ATTR",
        help=f"The application's authorizer, authorize(by, action, task) -> bool (env {AUTHORIZER_ENV}). "
        "Required by the actions.",
        show_default=False,
    ),
]
AppRef = Annotated[
    str | None,
    app_option(
        "The App (or Registry) with the definitions' code, as module:attribute (env REDSAGA_APP): "
        "its form types check answers. Without it, the forms' JSON schemas registered in Redis do."
    ),
]
Context = Annotated[
    str | None,
    typer.Option(
        "--context", help="Only this bounded context (default: every registered one).", show_default=False
    ),
]


def _authorizer(reference: str | None) -> Authorizer:
    if not reference:
        raise UsageProblem(
            f"acting on a task needs the application's authorizer: pass --authorizer or set {AUTHORIZER_ENV}"
        )
    loaded = load_object(reference)
    if not callable(loaded):
        raise UsageProblem(f"{reference} is a {type(loaded).__name__}, not an authorizer function")
    return loaded  # type: ignore[no-any-return]


def _registry(app_ref: str | None) -> Registry | None:
    loaded = definitions(app_ref)
    return loaded.registry if isinstance(loaded, App) else loaded


def _with_tasks(
    redis_url: str | None,
    app_ref: str | None,
    authorize: Authorizer,
    job: Callable[[TaskClient], Awaitable[Any]],
    context: str | None = None,
) -> Any:
    registry = _registry(app_ref)

    async def run(redis: Any) -> Any:
        contexts = None if context is None else [context]
        if context is not None and context not in await Versions(redis).contexts():
            raise CommandError(f"no context {context!r} is registered in this Redis")
        client = await TaskClient.from_redis(redis, registry, authorize=authorize, contexts=contexts)
        return await job(client)

    return with_redis(redis_url, run)


def task_json(task: Task, now_ms: int) -> dict[str, Any]:
    """A task as ``--json`` prints it (every field but its resume token; ``holder`` only while claimed)."""
    return {
        "id": task.id,
        "context": task.context,
        "partition": task.partition,
        "saga_id": task.saga_id,
        "saga": task.saga,
        "step": task.step,
        "title": task.title,
        "details": task.details,
        "form": task.form,
        "assignee": task.assignee,
        "state": task.state,
        "due_ms": task.due_ms,
        "created_ms": task.created_ms,
        "holder": task.holder_at(now_ms) or None,
        "claim_until_ms": task.claim_until_ms if task.holder_at(now_ms) else None,
        "escalated": task.escalated,
        "answer": task.answer,
        "answered_by": task.answered_by or None,
        "voters": task.voters,
        "quorum": task.quorum,
        "ballots": task.ballots,
        "revision": task.rev,
    }


def _rows(tasks: list[Task], now_ms: int) -> None:
    headers = ["id", "title", "assignee", "due", "claimed by", "state", "saga", "step"]
    rows = [
        [t.id, t.title, t.assignee, when(t.due_ms), t.holder_at(now_ms) or None, t.state, t.saga_id, t.step]
        for t in tasks
    ]
    emit_table(headers, rows)


@tasks_app.command("list")
@reporting_errors
def list_tasks(
    role: Annotated[str, typer.Option("--role", help="The open tasks of this role.")] = "",
    user: Annotated[str, typer.Option("--user", help="The open tasks assigned to this person.")] = "",
    context: Context = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most this many tasks.")] = 100,
    overdue: Annotated[bool, typer.Option("--overdue", help="Only the tasks past their due time.")] = False,
    app_ref: AppRef = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """List open tasks, soonest due first: of a role (--role), a person (--user), or every one.

    Only tasks assigned to that role or person directly are listed (a person's roles are the
    application's business); without either, every open task (an operator's view), with
    --overdue only those past their due time. --json prints a list of tasks (the shape is in
    docs/operations.md).
    """
    if role and user:
        raise UsageProblem("give at most one of --role ROLE and --user USER")

    async def job(client: TaskClient) -> tuple[list[Task], int]:
        found = await client.list(role=role, user=user, context=context, limit=limit, overdue=overdue)
        if not client.partitions(context):  # an empty list would say "no tasks": not known
            raise CommandError("no context is registered in this Redis: no worker has run here yet")
        return found, await client.engine.now_ms()

    found, now = _with_tasks(redis_url, app_ref, nobody, job, context)
    if json_output:
        emit_json([task_json(t, now) for t in found])
    else:
        _rows(found, now)


@tasks_app.command("show")
@reporting_errors
def show(task_id: TaskId, redis_url: RedisUrl = None, json_output: Json = False) -> None:
    """Show one task, in whatever state, and every action on it (who, what, when).

    --json prints {"task": {...}, "log": [{"at_ms", "task", "step", "action", "by", "detail"}]}.
    """

    async def job(client: TaskClient) -> tuple[Task, list[TaskLog], int]:
        task = await client.show(task_id)
        log = await client.engine.store.log(Partition(task.context, task.partition), task.saga_id)
        return task, [e for e in log if e.task == task.id], await client.engine.now_ms()

    task, log, now = _with_tasks(redis_url, None, nobody, job)
    if json_output:
        emit_json({"task": task_json(task, now), "log": log})
        return
    facts = [
        ("title", task.title),
        ("state", task.state),
        ("assignee", task.assignee),
        ("due", when(task.due_ms)),
        ("claimed by", task.holder_at(now) or "-"),
        ("saga", f"{task.saga_id} ({task.saga}, step {task.step})"),
        ("form", task.form),
        ("details", bytes(task.details).decode()),
    ]
    if task.state != "open":
        facts.append(("answer", f"{bytes(task.answer).decode()} by {task.answered_by or '-'}"))
    for name, value in facts:
        emit_line(value, prefix=f"{name:<11} ")
    emit_line()
    emit_table(["at", "action", "by", "detail"], [[when(e.at_ms), e.action, e.by, e.detail] for e in log])


def _act(
    redis_url: str | None,
    app_ref: str | None,
    authorizer: str | None,
    json_output: bool,
    done: str,
    job: Callable[[TaskClient], Awaitable[Task]],
) -> None:
    authorize = _authorizer(authorizer)

    async def acted(client: TaskClient) -> tuple[Task, int]:
        return await job(client), await client.engine.now_ms()

    task, now = _with_tasks(redis_url, app_ref, authorize, acted)
    if json_output:
        emit_json(task_json(task, now))
    else:
        emit_line(f"task {task.id} {done}")


@tasks_app.command("claim")
@reporting_errors
def claim(
    task_id: TaskId,
    by: By,
    authorizer: AuthorizerRef = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Claim a task for --by: one holder at a time, for the claim time (claim again to keep it).

    A task someone else holds is refused (TaskAlreadyClaimed, exit 1) until their claim
    expires. --json prints the task.
    """
    _act(redis_url, None, authorizer, json_output, f"claimed by {by}", lambda c: c.claim(task_id, by=by))


@tasks_app.command("release")
@reporting_errors
def release(
    task_id: TaskId,
    by: By,
    authorizer: AuthorizerRef = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Give back --by's claim on a task. --json prints the task."""
    _act(redis_url, None, authorizer, json_output, f"released by {by}", lambda c: c.release(task_id, by=by))


def _answer_option(text: str) -> bytes:
    try:
        msgspec.json.decode(text)
    except msgspec.DecodeError as error:
        raise typer.BadParameter(f"not JSON: {error}") from None
    return text.encode()


@tasks_app.command("complete")
@reporting_errors
def complete(
    task_id: TaskId,
    answer: Annotated[
        Any,
        typer.Option(
            "--answer",
            parser=_answer_option,
            metavar="JSON",
            help="The answer, as JSON of the task's form.",
            show_default=False,
        ),
    ],
    by: By,
    authorizer: AuthorizerRef = None,
    app_ref: AppRef = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Answer a task as --by; the saga resumes with the answer.

    The answer is checked against the task's form before anything is written (InvalidAnswer,
    exit 1): by the form's type with --app, else by the JSON schema its workers registered.
    A task someone else holds a claim on is refused; so is a closed one. --json prints the task.
    """
    _act(
        redis_url,
        app_ref,
        authorizer,
        json_output,
        f"completed by {by}",
        lambda c: c.complete(task_id, answer, by=by),
    )


def _assignee_option(text: str) -> Role | User:
    kind, _, name = text.partition(":")
    try:
        if kind == "role":
            return Role(name)
        if kind == "user":
            return User(name)
    except InvalidInput as error:
        raise typer.BadParameter(str(error)) from None
    raise typer.BadParameter(f"{text!r} is not role:NAME or user:NAME")


@tasks_app.command("reassign")
@reporting_errors
def reassign(
    task_id: TaskId,
    to: Annotated[
        Any,
        typer.Option(
            "--to",
            parser=_assignee_option,
            metavar="role:NAME|user:NAME",
            help="Who takes the task over.",
            show_default=False,
        ),
    ],
    by: By,
    authorizer: AuthorizerRef = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Give a task to another role or person as --by (any claim ends). --json prints the task."""
    _act(
        redis_url,
        None,
        authorizer,
        json_output,
        f"reassigned to {to.key} by {by}",
        lambda c: c.reassign(task_id, to, by=by),
    )
