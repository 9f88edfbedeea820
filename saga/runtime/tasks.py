"""The task inbox at run time: the ``tasks`` participant that opens tasks and fires their timers.

A human task's ``<name>.open`` step sends :class:`~saga.definition.human_tasks.OpenTask` to
the participant :func:`task_participant` makes (the worker runs it for every context whose
sagas have human tasks); it writes the task beside the saga (``saga/store/tasks.py``).
People act through :class:`~saga.runtime.task_client.TaskClient`: it checks who may act with the application's
:data:`Authorizer` **before** it writes, checks an answer against the task's form, and
completes the task and sends the saga its signal in one atomic write.

Who may send that signal: signals are accepted from any principal that signs (the resume
token is the capability, ``saga/store/trust.py``). The command that opens a task carries
only the token's unsigned reference (the command stream and the saga's recorded input are
in the read-only operator's reach); the inbox signs it again in the orchestrator's worker
and the store keeps the token apart from the task (``saga/store/tasks.py``), so only the
orchestrator's worker and the application's task client ever hold it, and ``SagaClient.signal``
refuses a task's wait (``saga/runtime/client.py``): an answer goes through the
:class:`~saga.runtime.task_client.TaskClient`, its authorizer and the task log.

Reminders and escalation steps are timers in the partition's task-timer set; the worker (or
:meth:`~saga.runtime.task_client.TaskClient.fire_due`) fires those due (each once: the
write is revision-checked).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Final

import msgspec

from bus import Bus, Clock, Envelope, Publisher
from redsaga.ids import derived_id
from saga.core import task_rules as rules
from saga.core.task_rules import Task, TaskChange
from saga.core.tokens import Signer, peek
from saga.definition.human_tasks import (
    TASKS,
    OpenTask,
    TaskOpened,
    TaskResult,
    TaskWithdrawn,
    WithdrawTask,
    check_actor,
)
from saga.definition.registry import Registry
from saga.errors import (
    InvalidInput,
    TaskClosed,
    TaskNotFound,
)
from saga.runtime.participant import CommandContext, Participant
from saga.runtime.protocol import SIGNAL, SignalDelivery
from saga.store.keys import Partition, check_saga_id
from saga.store.tasks import Message, TaskStore
from saga.store.trust import inbox_audience

Authorizer = Callable[[str, str, Task], bool]
"""``authorize(by, action, task)``: whether person ``by`` may ``action`` (claim, release,
complete, reassign) ``task``. The engine asks it before every write."""
CLAIM_TTL_MS: Final = 15 * 60 * 1000
_json = msgspec.json.Encoder()
_ATTEMPTS: Final = 20


def nobody(_by: str, _action: str, _task: Task) -> bool:
    """An :data:`Authorizer` that lets nobody act: for clients that only read the inbox."""
    return False


def by_roles(members: Callable[[str, str], bool], *, supervisors: str = "") -> Authorizer:
    """An :data:`Authorizer` from a role-membership callback ``members(user, role)``.

    A person may act on a task assigned to them or to a role they are in; members of
    ``supervisors`` may also reassign any task.
    """

    def authorize(by: str, action: str, task: Task) -> bool:
        mine = False
        for assignee in task.indexed:
            kind, _, name = assignee.partition(":")
            mine = mine or (name == by if kind == "user" else members(by, name))
        return mine or (action == "reassign" and bool(supervisors) and members(by, supervisors))

    return authorize


def role_table(roles: Mapping[str, Collection[str]], *, supervisors: str = "") -> Authorizer:
    """:func:`by_roles` over a fixed table ``{role: users}``."""
    return by_roles(lambda user, role: user in roles.get(role, ()), supervisors=supervisors)


def task_id_of(context: str, partition: int, saga_id: str, step: str, n: int) -> str:
    """A task's id: ``<context>:<partition>:<uuid>`` (it names its partition, so no search finds it)."""
    return f"{context}:{partition}:{derived_id(saga_id, f'{step}:task:{n}')}"


def partition_of_task(task_id: str) -> Partition:
    """The partition a task id names; :class:`TaskNotFound` for an id that names none."""
    context, _, rest = check_saga_id(task_id).partition(":")
    index, _, _ = rest.partition(":")
    if not context or not index.isdigit():
        raise TaskNotFound(task_id)
    return Partition(context, int(index))


class TaskEngine:
    """The writes every task action shares: decide on the current task, apply, retry on a race."""

    def __init__(
        self,
        store: TaskStore,
        clock: Clock,
        publisher: Publisher,
        *,
        source: str,
        signer: Callable[[str], Awaitable[Signer]] | None = None,
    ) -> None:
        self.store, self.clock, self.publisher, self.source = store, clock, publisher, source
        self.signer = signer
        """The signer of a context's resume tokens: the task inbox's, in the orchestrator's worker
        (it signs the reference an :class:`OpenTask` carries); a task client has none."""

    async def task(self, task_id: str) -> Task:
        """The task ``task_id`` (:class:`TaskNotFound`)."""
        task = await self.store.load(partition_of_task(task_id), task_id)
        if task is None:
            raise TaskNotFound(task_id)
        return task

    async def now_ms(self) -> int:
        """Now, by the clock the engine's timers use: Redis ``TIME``, or a test's clock if one is set.

        Claims expire and task timers fall due by this clock, as saga timers do
        (``docs/time.md``): a worker or a web app whose clock is off claims nothing longer or
        shorter and fires nothing early.
        """
        scripted = self.clock.script_now_ms()
        return scripted if scripted >= 0 else await self.store.server_ms()

    async def apply(self, task_id: str, decide: Callable[[Task, int], TaskChange]) -> Task:
        """Decide on the task as stored and write; on a race read again and decide again."""
        for _ in range(_ATTEMPTS):
            task = await self.task(task_id)
            now = await self.now_ms()
            change = decide(task, now)
            if not change.task.token and any(out.kind == "signal" for out in change.outgoing):
                change.task.token = await self.store.token(partition_of_task(task_id), task_id)
            if await self.store.write(partition_of_task(task_id), change, self.messages(change, now)):
                return change.task
        raise TaskNotFound(task_id)  # pragma: no cover - only under a storm of writers

    def messages(self, change: TaskChange, now_ms: int) -> list[Message]:
        """The envelopes ``change`` sends, signed as this client's principal."""
        task, found = change.task, []
        partition = Partition(task.context, task.partition)
        for n, out in enumerate(change.outgoing):
            common: dict[str, Any] = {"id": message_id(task, n), "source": self.source}
            if out.kind == "signal":
                delivery = SignalDelivery(
                    step=f"{task.step}.answer", n=task.n, data=out.data, by=out.by, token=task.token
                )
                envelope = Envelope(
                    type=SIGNAL,
                    payload=_json.encode(delivery),
                    correlation_id=task.saga_id,
                    created_at_ms=now_ms,
                    **common,
                )
                stream, audience = partition.inbox, inbox_audience(task.context)
            else:
                envelope = Envelope(
                    type="TaskNotice",
                    payload=bytes(out.data),
                    correlation_id=task.saga_id,
                    created_at_ms=now_ms,
                    **common,
                )
                stream = partition.commands(out.participant)
                audience = None
            found.append((stream, self.publisher.signed(stream, envelope, audience, None)))
        return found

    async def open(self, command: OpenTask, _ctx: CommandContext) -> TaskOpened:
        """Open the task ``command`` asks for (once: a repeat finds it open and changes nothing)."""
        ref = peek(command.token)
        task_id = task_id_of(ref.context, ref.partition, ref.saga_id, command.step, ref.n)
        partition = Partition(ref.context, ref.partition)
        existing = await self.store.load(partition, task_id)
        if existing is None:
            command = msgspec.structs.replace(command, token=await self._token(ref.context, command.token))
            for assignee in command.voters or [command.assignee]:
                check_actor(assignee.partition(":")[2], "assignee")
            refs = (ref.context, ref.partition, ref.saga_id, ref.n)
            change = rules.opened(task_id, refs, command, await self.now_ms())
            change.task.rev = 1
            if await self.store.write(partition, change, []):
                return TaskOpened(task_id=task_id, due_ms=change.task.due_ms)
            existing = await self.task(task_id)
        return TaskOpened(task_id=task_id, due_ms=existing.due_ms)

    async def _token(self, context: str, token: str) -> str:
        """The resume token of an :class:`OpenTask`'s reference (a token already, from an earlier release)."""
        if token.count(".") == 2:
            return token
        if self.signer is None:
            raise InvalidInput("this task engine opens no task: it holds no context's token key")
        return (await self.signer(context)).complete(token)

    async def withdraw(self, command: WithdrawTask, _ctx: CommandContext) -> TaskWithdrawn:
        """Withdraw ``command``'s task if it is still open (a repeat finds it closed: ``withdrawn=False``)."""
        task_id = command.task_id
        task = await self.store.load(partition_of_task(task_id), task_id)
        if task is None or task.state != "open":
            return TaskWithdrawn(task_id=task_id, withdrawn=False)
        try:
            await self.apply(task_id, lambda t, now: rules.withdrawn(t, now, command.reason))
        except TaskClosed:  # answered (or ended) between the read and the write
            return TaskWithdrawn(task_id=task_id, withdrawn=False)
        return TaskWithdrawn(task_id=task_id, withdrawn=True)

    async def fire_due(self, partitions: Collection[Partition], *, limit: int = 100) -> int:
        """Fire every task timer due now (reminders, escalation steps); how many fired."""
        fired = 0
        now = await self.now_ms()
        for partition in partitions:
            for member, _at in await self.store.due_timers(partition, now, limit):
                task_id, _, stage = member.rpartition("|")
                fired += await self._fire(task_id, stage)
        return fired

    async def _fire(self, task_id: str, stage: str) -> int:
        member = rules.timer_member(task_id, stage)  # type: ignore[arg-type]
        done = False

        def decide(task: Task, now: int) -> TaskChange:
            nonlocal done
            if task.state != "open":
                done = True
                change = TaskChange(task=msgspec.structs.replace(task, rev=task.rev + 1), before_rev=task.rev)
                change.untimers.append(member)
                return change
            failed = failure("escalation", "not answered in time")
            default = msgspec.Raw(
                b'{"answer":' + bytes(task.default) + b',"by":"escalation","outcome":"default"}'
            )
            return rules.fired(task, stage, now, failed=failed, default=default)  # type: ignore[arg-type]

        await self.apply(task_id, decide)
        return 0 if done else 1


def failure(by: str, reason: str) -> msgspec.Raw:
    """The signal's data when a task fails: the saga's step fails with ``reason``."""
    return msgspec.Raw(_json.encode(TaskResult[Any](outcome="failed", by=by, reason=reason)))


def task_participant(engine: TaskEngine, contexts: Collection[str]) -> Participant:
    """The ``tasks`` participant: opens and withdraws the tasks of ``contexts``."""
    participant = Participant(TASKS, serves=contexts)
    participant.handles(OpenTask)(engine.open)
    participant.handles(WithdrawTask)(engine.withdraw)
    return participant


def message_id(task: Task, n: int) -> str:
    """The id of the ``n``-th message the write that made ``task`` (at its revision) sends."""
    return derived_id(task.id, f"{task.rev}:{n}")


def task_contexts(registry: Registry) -> set[str]:
    """The contexts whose definitions have human tasks (their ``<name>.open`` steps reply ``TaskOpened``)."""
    return {d.context.name for d in registry for s in d.steps if s.output_type is TaskOpened}


def install_tasks(bus: Bus, engine: TaskEngine, registry: Registry) -> bool:
    """Install the ``tasks`` participant on ``bus`` if any definition has a human task."""
    contexts = task_contexts(registry)
    if contexts:
        task_participant(engine, contexts).install(bus)
    return bool(contexts)
