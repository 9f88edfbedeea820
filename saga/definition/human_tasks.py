"""Human tasks: a step that waits for a person's typed answer.

``saga.human_task("approve", title=..., form=Approval, assignee=Role("managers"), due=...)``
adds three steps, made by the decorator core like any other:

- ``<name>.open``: a command to the task inbox (the participant :data:`TASKS`, run by
  :func:`saga.runtime.tasks.task_participant`) carrying an :class:`OpenTask`: the title,
  the details a person needs, the form's type name, the assignee, the due time, the
  reminder and the escalation policy, and which wait the task answers (the reference of
  its resume token, never the token: ``docs/security.md``). Its compensation
  withdraws the task (a cancel or a failure after it, a quorum reached elsewhere).
- ``<name>.answer``: a signal wait (the saga is ``suspended``) for a :class:`TaskResult`,
  which ``TaskClient.complete`` sends once the answer has been checked against the form,
  and the escalation policy sends when it takes the default answer or fails the task.
- ``<name>``: a local action that returns the answer (of type ``form``; use
  ``ctx.output(step)`` in later steps) or fails the saga when the task failed.

Assignees are a :class:`Role`, a :class:`User`, or a function of the saga's data returning
one. Their names become part of Redis keys, so they are checked (:func:`check_actor`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar

import msgspec

from saga.definition.retry import Retry
from saga.definition.step import Command, Step, StepContext, command
from saga.definition.waits import check_one_argument
from saga.definition.where import Where
from saga.errors import InvalidInput, TaskError

if TYPE_CHECKING:
    from saga.definition.saga import Saga

TASKS: Final = "tasks"
ANSWER_SUFFIX: Final = ".answer"
"""What a human task's signal wait step adds to the task's name (``approve.answer``)."""
"""The participant that keeps the task inbox (``cmd:tasks`` of each partition)."""
_ONCE: Final = Retry(attempts=1, on_exhausted="compensate")
_ACTOR: Final = re.compile(r"[A-Za-z0-9_.@+-]{1,100}")
F = TypeVar("F")
D = TypeVar("D")


def check_actor(name: str, what: str = "name") -> str:
    """``name`` if it may name a role or a user (it becomes part of a key), else :class:`InvalidInput`.

    1-100 characters of ``A-Z a-z 0-9 _ . @ + -``: no glob, hash-tag or separator character.
    """
    if not isinstance(name, str) or not _ACTOR.fullmatch(name):
        raise InvalidInput(f"{what} {name!r} is not valid: 1-100 of A-Z a-z 0-9 _ . @ + -")
    return name


@dataclass(frozen=True, slots=True)
class Role:
    """Assign to everyone in a role (the application's authorizer says who is)."""

    name: str

    def __post_init__(self) -> None:
        check_actor(self.name, "role")

    @property
    def key(self) -> str:
        """How the task inbox writes it: ``role:<name>``."""
        return f"role:{self.name}"


@dataclass(frozen=True, slots=True)
class User:
    """Assign to one person."""

    name: str

    def __post_init__(self) -> None:
        check_actor(self.name, "user")

    @property
    def key(self) -> str:
        """How the task inbox writes it: ``user:<name>``."""
        return f"user:{self.name}"


Assignee = Role | User
"""Who a task is for."""


@dataclass(frozen=True, slots=True)
class Escalation:
    """What happens when a task's due time passes unanswered, each step recorded.

    At the due time: reassign to ``reassign_to`` (if given), notify (if ``notify`` and the
    task names a notifications participant) and, if ``extend`` is given, push the due time
    back once by it. At the (extended) due time: ``then`` -- ``"fail"`` fails the task (the
    saga compensates) or ``"default"`` completes it with ``default`` (an instance of the form).
    """

    reassign_to: Assignee | Callable[[Any], Assignee] | None = None
    """Who takes over, or a function of the saga's data choosing them (per approver, say)."""
    notify: bool = True
    extend: timedelta | None = None
    then: Literal["fail", "default"] = "fail"
    default: Any = None


class OpenTask(msgspec.Struct, tag="OpenTask", kw_only=True, frozen=True):
    """The command that opens a task in the inbox (sent by ``<name>.open``)."""

    saga: str
    """``name@version`` of the saga."""
    step: str
    title: str
    details: msgspec.Raw
    form: str
    assignee: str
    due_in_ms: int
    token: str
    """The wait's resume token without its signature (``saga.core.tokens.unsigned``): it names
    the wait and resumes nothing; the task inbox, in the orchestrator's worker, signs it
    again and keeps the token where only it and the task client read it."""
    remind_before_ms: int = 0
    notify: str = ""
    escalate_to: str = ""
    escalate_notify: bool = False
    extend_ms: int = 0
    then: str = "fail"
    default: msgspec.Raw = msgspec.Raw(b"null")
    voters: list[str] = msgspec.field(default_factory=list)
    """A quorum task's voters (``user:<name>``); ``assignee`` then reads ``<k> of <n>``."""
    quorum: int = 0
    vote: str = ""


class TaskOpened(msgspec.Struct, tag="TaskOpened", kw_only=True, frozen=True):
    """The inbox's reply: the task's id and its due time (Unix ms)."""

    task_id: str
    due_ms: int


class WithdrawTask(msgspec.Struct, tag="WithdrawTask", kw_only=True, frozen=True):
    """The compensation of ``<name>.open``: withdraw the task if it is still open.

    ``task_id`` is what the inbox replied to the open (the wait's resume token would name
    the *next* wait by then: a cancelled wait has ended).
    """

    task_id: str
    reason: str = "the saga no longer waits for it"


class TaskWithdrawn(msgspec.Struct, tag="TaskWithdrawn", kw_only=True, frozen=True):
    """The inbox's reply to :class:`WithdrawTask` (``withdrawn``: it was still open)."""

    task_id: str
    withdrawn: bool


class TaskResult(msgspec.Struct, Generic[F], kw_only=True, frozen=True):
    """What the task's wait receives: the answer, or why there is none."""

    answer: F | None = None
    by: str = ""
    outcome: Literal["answered", "default", "failed"] = "answered"
    reason: str = ""


AssigneeSpec = Assignee | Callable[[Any], Assignee]
TextSpec = str | Callable[[Any], str]
Announce = Callable[[Any, str], Awaitable[None]]
"""``async def announce(data, task_id)``: tell people about the task (a local action)."""
Unannounce = Callable[[Any], Awaitable[None]]
"""``async def unannounce(data)``: the announcement's undo, when the saga compensates."""


@dataclass(frozen=True, slots=True)
class _Spec:
    """What a human task or a quorum task is declared with (checked by :func:`_declare`)."""

    title: TextSpec
    form: type[Any]
    due: timedelta
    details: Callable[[Any], object] | None
    reminder: timedelta | None
    escalation: Escalation | None
    notify: str
    announce: Announce | None
    unannounce: Unannounce | None


def declare_human_task(
    saga: Saga[D],
    name: str,
    *,
    title: TextSpec,
    form: type[F],
    assignee: AssigneeSpec,
    due: timedelta,
    details: Callable[[Any], object] | None = None,
    reminder: timedelta | None = None,
    escalation: Escalation | None = None,
    notify: str = "",
    announce: Announce | None = None,
    unannounce: Unannounce | None = None,
) -> Step[D, F]:
    """Add a human task to ``saga`` (see the module docstring); return the step whose output is the answer.

    ``details(data)`` is what the person sees beside the title (default: the saga's data);
    ``reminder`` sends a reminder that long before the due time to ``notify`` (the
    application's notifications participant). ``announce(data, task_id)`` runs once the
    task is open (send a link to it), undone by ``unannounce(data)`` if the saga compensates.
    """
    where = Where(saga.name, name)
    if callable(assignee) and not isinstance(assignee, type):
        check_one_argument(assignee, where, "a computed assignee")
    elif not isinstance(assignee, Role | User):
        raise where.error("assignee is a Role, a User, or a function of the data returning one")

    def chosen(data: Any) -> tuple[str, list[str]]:
        found = assignee(data) if callable(assignee) else assignee
        if not isinstance(found, Role | User):
            raise InvalidInput(f"{saga.name}.{name}: the assignee function returned {found!r}")
        return found.key, []

    spec = _Spec(title, form, due, details, reminder, escalation, notify, announce, unannounce)
    return _declare(saga, name, spec, chosen, form, quorum=0, vote="")


def declare_quorum_task(
    saga: Saga[D],
    name: str,
    *,
    title: TextSpec,
    form: type[F],
    voters: Callable[[Any], Sequence[User]],
    quorum: int,
    due: timedelta,
    vote: str = "approved",
    details: Callable[[Any], object] | None = None,
    reminder: timedelta | None = None,
    escalation: Escalation | None = None,
    notify: str = "",
    announce: Announce | None = None,
    unannounce: Unannounce | None = None,
) -> Step[D, list[F]]:
    """Add a k-of-n task: every one of ``voters(data)`` gets it, ``quorum`` of them must say yes.

    Each voter answers their own ballot (nothing to claim); an answer counts toward the
    quorum when its boolean field ``vote`` is true. As soon as ``quorum`` answers say yes the
    task is completed -- the ballots still open are withdrawn, each recorded -- and the
    step's output is the answers given, in the order they came; as soon as too few voters
    are left to reach it, the task fails. The escalation policy may notify, extend and
    fail (a quorum is not reassigned, and has no default answer).
    """
    where = Where(saga.name, name)
    check_one_argument(voters, where, "voters")
    if not isinstance(quorum, int) or quorum < 1:
        raise where.error(f"quorum is a positive number of voters, not {quorum!r}")
    if isinstance(form, type) and vote not in getattr(form, "__struct_fields__", ()):
        raise where.error(f"the form {form.__name__} has no field {vote!r} to count")
    policy = escalation or Escalation()
    if policy.reassign_to is not None or policy.then != "fail":
        raise where.error("a quorum task's escalation may notify, extend and fail; not reassign or default")

    def chosen(data: Any) -> tuple[str, list[str]]:
        found = list(voters(data))
        if not found or not all(isinstance(v, User) for v in found) or len(set(found)) != len(found):
            raise InvalidInput(f"{saga.name}.{name}: voters are distinct Users, not {found!r}")
        if len(found) < quorum:
            raise InvalidInput(f"{saga.name}.{name}: {len(found)} voters cannot reach a quorum of {quorum}")
        return f"{quorum} of {len(found)}", [v.key for v in found]

    spec = _Spec(title, form, due, details, reminder, escalation, notify, announce, unannounce)
    return _declare(saga, name, spec, chosen, list[form], quorum=quorum, vote=vote)  # type: ignore[valid-type]


def _declare(
    saga: Saga[D],
    name: str,
    spec: _Spec,
    chosen: Callable[[Any], tuple[str, list[str]]],
    output: Any,
    *,
    quorum: int,
    vote: str,
) -> Step[D, Any]:
    where = Where(saga.name, name)
    form, due, reminder = spec.form, spec.due, spec.reminder
    if not isinstance(form, type) or not issubclass(form, msgspec.Struct):
        raise where.error("a human task's form is a msgspec.Struct type")
    if not isinstance(due, timedelta) or due <= timedelta():
        raise where.error(f"due is a positive timedelta, not {due!r}")
    if reminder is not None and not timedelta() < reminder < due:
        raise where.error("reminder is a timedelta before the due time")
    if reminder is not None and not spec.notify:
        raise where.error("a reminder needs a notifications participant (notify=...)")
    for function, what in ((spec.title, "title"), (spec.details, "details")):
        if callable(function) and not isinstance(function, type):
            check_one_argument(function, where, f"a computed {what}")
    policy = spec.escalation or Escalation()
    if callable(policy.reassign_to):
        check_one_argument(policy.reassign_to, where, "a computed escalation assignee")
    default = _default_of(policy, form, where)
    result_type: Any = TaskResult[output]
    answer_name = f"{name}{ANSWER_SUFFIX}"

    def open_task(data: Any, ctx: StepContext) -> Command:
        assignee, voters = chosen(data)
        text = spec.title(data) if callable(spec.title) else spec.title
        escalate_to = policy.reassign_to(data) if callable(policy.reassign_to) else policy.reassign_to
        return command(
            TASKS,
            OpenTask(
                saga=saga.key,
                step=name,
                title=text,
                details=msgspec.Raw(msgspec.json.encode(spec.details(data) if spec.details else data)),
                form=form.__name__,
                assignee=assignee,
                due_in_ms=_ms(due),
                # the reference only: the command and the step's recorded input are in the
                # operator's reach; the task inbox signs it again where only it keeps it
                token=ctx.resume_token(answer_name).rpartition(".")[0],
                remind_before_ms=_ms(reminder) if reminder else 0,
                notify=spec.notify,
                escalate_to=escalate_to.key if escalate_to else "",
                escalate_notify=policy.notify and bool(spec.notify),
                extend_ms=_ms(policy.extend) if policy.extend else 0,
                then=policy.then,
                default=default,
                voters=voters,
                quorum=quorum,
                vote=vote,
            ),
        )

    def withdraw_task(_data: Any, ctx: StepContext) -> Command:
        return command(TASKS, WithdrawTask(task_id=ctx.output(open_step).task_id))

    saga.compensation(f"{name}.withdraw")(withdraw_task)
    open_step = saga.step(reply=TaskOpened, name=f"{name}.open", compensate=f"{name}.withdraw")(open_task)
    if spec.announce is not None:
        _announce(saga, name, open_step, spec.announce, spec.unannounce)
    answer_step = saga.wait_signal(answer_name, output=result_type)

    async def take_answer(_data: Any, ctx: StepContext) -> Any:
        result = ctx.output(answer_step)
        if result.outcome == "failed" or result.answer is None:
            raise TaskError(f"task {name!r} failed: {result.reason or 'no answer'}", task=name)
        return result.answer

    take_answer.__annotations__["return"] = output
    # One attempt, then compensate: a failed task does not get better by asking again.
    step: Step[D, Any] = saga.action(name=name, retry=_ONCE)(take_answer)
    return step


def _announce(
    saga: Saga[Any], name: str, open_step: Step[Any, TaskOpened], announce: Announce, undo: Unannounce | None
) -> None:
    async def announce_task(data: Any, ctx: StepContext) -> None:
        await announce(data, ctx.output(open_step).task_id)

    if undo is not None:
        send_undo = undo

        async def unannounce_task(data: Any, _ctx: StepContext) -> None:
            await send_undo(data)

        saga.compensation(f"{name}.unannounce")(unannounce_task)
    saga.action(name=f"{name}.announce", compensate=f"{name}.unannounce" if undo else None)(announce_task)


def _default_of(policy: Escalation, form: type[Any], where: Where) -> msgspec.Raw:
    if policy.then not in ("fail", "default"):
        raise where.error(f"escalation ends with 'fail' or 'default', not {policy.then!r}")
    if policy.then == "fail":
        return msgspec.Raw(b"null")
    if not isinstance(policy.default, form):
        raise where.error(f"the default answer is a {form.__name__}, not {policy.default!r}")
    return msgspec.Raw(msgspec.json.encode(policy.default))


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)
