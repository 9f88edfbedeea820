"""People's side of human tasks: :class:`TaskClient` lists, claims, answers and reassigns them.

It checks who may act with the application's :data:`~saga.runtime.tasks.Authorizer`
**before** it writes, checks an answer against the task's form (by its type when this
process has the saga's code, else by the JSON schema its workers registered), and
completes the task and sends the saga its signal in one atomic write through the task
engine (``saga/runtime/tasks.py``), which also fires due reminders and escalations.
"""

from __future__ import annotations

import builtins
import functools
import typing
from collections.abc import Callable, Collection
from typing import Any

import msgspec

from bus import Clock, Publisher, SystemClock
from bus.lowlevel import RideThrough, rides_through
from saga.core import task_rules as rules
from saga.core.task_rules import Task, TaskChange, TaskLog
from saga.definition.human_tasks import (
    Assignee,
    check_actor,
)
from saga.definition.registry import Registry
from saga.errors import (
    InvalidAnswer,
    InvalidInput,
    NotAuthorized,
    UnknownDefinition,
)
from saga.runtime.config import EngineConfig
from saga.runtime.tasks import CLAIM_TTL_MS, Authorizer, TaskEngine, failure
from saga.store.keys import Partition
from saga.store.tasks import TaskStore
from saga.versions.catalogue import Catalogue

_json = msgspec.json.Encoder()


class TaskClient:
    """What a person's application calls: list, show, claim, release, complete, reassign.

    Every action names who does it (``by``) and is checked by ``authorize`` before anything
    is written (:class:`NotAuthorized`); each is recorded in the saga's task log. An action
    of a client without a keyring raises :class:`bus.AuthError` unless signing was turned
    off on purpose (``REDSAGA_VERIFY=off``): its answer would reach the saga unsigned.
    """

    def __init__(
        self,
        redis: Any,
        registry: Registry,
        *,
        authorize: Authorizer,
        clock: Clock | None = None,
        config: EngineConfig | None = None,
        claim_ttl_ms: int = CLAIM_TTL_MS,
        store: TaskStore | None = None,
        source: str = "tasks",
        catalogue: Catalogue | None = None,
    ) -> None:
        from saga.store.tasks import RedisTaskStore  # noqa: PLC0415 - only when no store is given

        config = config or EngineConfig()
        self.registry = registry
        self.catalogue = catalogue or Catalogue.of(registry)
        """The contexts and partitions to list, and the forms' registered schemas (:meth:`from_redis`)."""
        self.authorize = authorize
        self.claim_ttl_ms = claim_ttl_ms
        principal = config.auth.signer_for("client", "operator", "orchestrator")
        publisher = Publisher(redis, source=source, config=config.bus, auth=config.auth, principal=principal)
        self.engine = TaskEngine(
            store or RedisTaskStore(redis), clock or SystemClock(), publisher, source=source
        )
        self.ride_through = RideThrough(self.engine.clock, config.unavailable_deadline_s)
        # Checked at each action, not here: listing and showing tasks need only a Redis URL.
        self._check_signing = (
            None
            if redis is None
            else functools.partial(config.check_signing, f"the TaskClient {source!r}", redis, warn=False)
        )
        """What retries this client's calls while Redis is unavailable (a failover, a restart).

        An action whose reply was lost is decided again on the task as stored."""

    @classmethod
    async def from_redis(
        cls,
        redis: Any,
        registry: Registry | None = None,
        *,
        authorize: Authorizer,
        contexts: Collection[str] | None = None,
        **options: Any,
    ) -> TaskClient:
        """A task client on the definitions workers registered in Redis, no code needed.

        The registered contexts (every one, or only ``contexts``) give the partitions to
        list, and each form's registered JSON schema checks answers to tasks whose code
        ``registry`` (if given) does not have. ``options`` are the constructor's.
        """
        registry = Registry([]) if registry is None else registry
        catalogue = Catalogue.of(registry).merge(await Catalogue.load(redis, contexts=contexts))
        return cls(redis, registry, authorize=authorize, catalogue=catalogue, **options)

    def partitions(self, context: str | None = None) -> list[Partition]:
        """Every partition of ``context`` (or of every context this client knows)."""
        known = self.catalogue
        contexts = [known.context(context)] if context else list(known.contexts.values())
        return [Partition(c.name, i) for c in contexts for i in range(c.partitions)]

    @rides_through
    async def list(
        self,
        *,
        role: str = "",
        user: str = "",
        context: str | None = None,
        limit: int = 100,
        overdue: bool = False,
    ) -> builtins.list[Task]:
        """Open tasks assigned to ``role`` or ``user`` (neither: every open task), soonest due first.

        No scan: one index per partition (the assignee's, or the task timers). ``overdue``
        keeps only the tasks past their due time (by the engine's clock).
        """
        if role and user:
            raise InvalidInput("list the tasks of a role or of a user, not both")
        assignee = f"role:{check_actor(role, 'role')}" if role else ""
        assignee = f"user:{check_actor(user, 'user')}" if user else assignee
        due_by = await self.engine.now_ms() if overdue else None
        store, found = self.engine.store, []
        for partition in self.partitions(context):
            if assignee:
                found += await store.open_for(partition, assignee, limit)
            else:
                found += await store.open_tasks(partition, due_by, limit)
        due = [t for t in found if due_by is None or t.due_ms <= due_by]
        return sorted(due, key=lambda t: (t.due_ms, t.id))[:limit]

    @rides_through
    async def show(self, task_id: str) -> Task:
        """The task, in whatever state (:class:`TaskNotFound`)."""
        return await self.engine.task(task_id)

    @rides_through
    async def log(self, saga_id: str, *, context: str | None = None) -> builtins.list[TaskLog]:
        """Every task action of saga ``saga_id``, oldest first."""
        from saga.store.keys import partition_of  # noqa: PLC0415 - a helper of the keys module

        ctx = self.catalogue.context(context)
        return await self.engine.store.log(
            Partition(ctx.name, partition_of(saga_id, ctx.partitions)), saga_id
        )

    @rides_through
    async def claim(self, task_id: str, *, by: str) -> Task:
        """Claim the task for ``by`` for ``claim_ttl_ms`` (claim again to keep it)."""
        return await self._act(
            task_id, by, "claim", lambda t, now: rules.claimed(t, by, now, self.claim_ttl_ms)
        )

    @rides_through
    async def release(self, task_id: str, *, by: str) -> Task:
        """Give the claim back."""
        return await self._act(task_id, by, "release", lambda t, now: rules.released(t, by, now))

    @rides_through
    async def reassign(self, task_id: str, to: Assignee, *, by: str) -> Task:
        """Give the task to another role or user (any claim ends)."""
        return await self._act(task_id, by, "reassign", lambda t, now: rules.reassigned(t, by, now, to.key))

    @rides_through
    async def complete(self, task_id: str, answer: object, *, by: str) -> Task:
        """Answer the task; the saga resumes with ``answer`` (checked against the form first)."""
        self._may_write()
        task = await self.engine.task(task_id)
        encoded = self.check_answer(task, answer)
        if task.quorum:
            lost = failure(by, "the quorum can no longer be reached")
            return await self._act(
                task_id,
                by,
                "complete",
                lambda t, now: rules.voted(t, by, now, msgspec.Raw(encoded), failed=lost),
            )
        result = b'{"answer":' + encoded + b',"by":' + _json.encode(by) + b',"outcome":"answered"}'
        return await self._act(
            task_id,
            by,
            "complete",
            lambda t, now: rules.completed(t, by, now, msgspec.Raw(result), msgspec.Raw(encoded)),
        )

    def check_answer(self, task: Task, answer: object) -> bytes:
        """``answer`` encoded, if it is a valid instance of the task's form (:class:`InvalidAnswer`).

        Checked by the form's type when this client has the saga's code, else by the form's
        JSON schema its workers registered (:meth:`from_redis`).
        """
        name, _, version = task.saga.rpartition("@")
        try:
            form = self.registry.get(name, int(version)).step_named(task.step).output_type
        except (UnknownDefinition, KeyError, ValueError):
            return self._check_by_shape(task, answer)
        form = typing.get_args(form)[0] if task.quorum else form  # list[form]: one ballot
        try:
            raw = answer if isinstance(answer, bytes | str) else msgspec.json.encode(answer)
            return msgspec.json.encode(msgspec.json.decode(raw, type=form))
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError) as error:
            raise InvalidAnswer(task.id, form=task.form, reason=str(error)) from error

    def _check_by_shape(self, task: Task, answer: object) -> bytes:
        name, _, version = task.saga.rpartition("@")
        try:
            shape = self.catalogue.shape(name, int(version)).step_named(task.step).output
        except (UnknownDefinition, KeyError, ValueError) as error:
            raise InvalidAnswer(
                task.id, form=task.form, reason=f"the form is not known here ({error})"
            ) from error
        if shape is None:  # pragma: no cover - a human task's step always has its form's type
            raise InvalidAnswer(task.id, form=task.form, reason="the form has no registered schema")
        try:
            value = (
                msgspec.json.decode(answer)
                if isinstance(answer, bytes | str)
                else msgspec.to_builtins(answer)
            )
            checked = shape.check([value])[0] if task.quorum else shape.check(value)  # quorum: list[form]
        except (msgspec.DecodeError, TypeError, ValueError) as error:
            raise InvalidAnswer(task.id, form=task.form, reason=str(error)) from error
        return _json.encode(checked)

    @rides_through
    async def fire_due(self, context: str | None = None) -> int:
        """Fire the due reminders and escalation steps of ``context``'s tasks (the worker does this)."""
        self._may_write()
        return await self.engine.fire_due(self.partitions(context))

    def _may_write(self) -> None:
        """Refuse to write without a keyring (an unsigned answer would leave its saga waiting)."""
        if self._check_signing is not None:
            self._check_signing()

    async def _act(
        self, task_id: str, by: str, action: str, decide: Callable[[Task, int], TaskChange]
    ) -> Task:
        check_actor(by, "person")
        self._may_write()

        def checked(task: Task, now: int) -> TaskChange:
            if not self.authorize(by, action, task):
                raise NotAuthorized(task.id, by=by, action=action)
            return decide(task, now)

        return await self.engine.apply(task_id, checked)
