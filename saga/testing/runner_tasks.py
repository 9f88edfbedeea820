"""The in-process runner's task inbox: ``runner.tasks(role=...)``, claims and answers from a test.

The inbox is the engine's own: the ``tasks`` participant (:func:`~saga.runtime.tasks.task_participant`)
opens and withdraws tasks as it does beside a worker, and :class:`~saga.runtime.tasks.TaskClient`
lists, claims, releases, completes and reassigns them with its checks (the authorizer, the
form, the claim holder), both over a :class:`~saga.store.tasks.MemoryTaskStore` on the
runner's virtual clock. What a write sends goes on the runner's queue as the streams would
carry it: the signal that resumes the saga to the orchestrator (its token verified as the
orchestrator verifies it), notifications to the notifications participant if the runner
has one (every notice is kept in :attr:`RunnerTasks.notices` either way).

Reminders and escalation steps are the inbox's timers: :meth:`SagaRunner.advance` fires
them at their due times, in order with the sagas' own timers.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import msgspec

from bus import FakeClock
from saga.core.task_rules import Notice, Task, TaskLog
from saga.core.tokens import Signer
from saga.definition.human_tasks import Assignee
from saga.definition.registry import Registry
from saga.runtime.config import EngineConfig
from saga.runtime.participant import Participant
from saga.runtime.protocol import SIGNAL, signal_token, to_event
from saga.runtime.task_client import TaskClient
from saga.runtime.tasks import CLAIM_TTL_MS, Authorizer, task_contexts, task_participant
from saga.store.keys import Partition
from saga.store.tasks import MemoryTaskStore
from saga.testing.fakes import FakeParticipant, participants_of
from saga.testing.runner_queue import CommandItem, EventItem, Item
from saga.testing.runner_session import Session

T = TypeVar("T")
_notice = msgspec.json.Decoder(Notice)


def anyone(_by: str, _action: str, _task: Task) -> bool:
    """The runner's default authorizer: anyone may act on any task."""
    return True


class RunnerTasks:
    """The task inbox of a :class:`~saga.testing.SagaRunner` (``runner.tasks``).

    Call it to list: ``runner.tasks(role="managers")`` or ``runner.tasks(user="ann")``, open
    tasks soonest due first. :meth:`claim`, :meth:`release`, :meth:`complete` and
    :meth:`reassign` act as :class:`~saga.runtime.tasks.TaskClient` does (and raise its
    :class:`~saga.errors.TaskError`s); what they send is decided on the next run
    (``run_until_idle``, ``advance``), like :meth:`SagaRunner.signal`.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        config: EngineConfig,
        clock: FakeClock,
        session: Session,
        enqueue: Callable[[Item], None],
        signer: Callable[[str], Signer],
        partition_of: Callable[[str], Partition],
        authorize: Authorizer = anyone,
        claim_ttl_ms: int = CLAIM_TTL_MS,
    ) -> None:
        self.store = MemoryTaskStore()
        """The tasks, their indexes, timers and logs."""
        self.client = TaskClient(
            None,
            registry,
            authorize=authorize,
            clock=clock,
            config=config,
            store=self.store,
            claim_ttl_ms=claim_ttl_ms,
        )

        async def signer_of(context: str) -> Signer:
            return signer(context)

        self.client.engine.signer = signer_of  # its inbox opens tasks, as the worker's does
        self.notices: list[Notice] = []
        """Every reminder, escalation and overdue notice sent, in order."""
        self.contexts = task_contexts(registry)
        self.participant: Participant | None = (
            task_participant(self.client.engine, self.contexts) if self.contexts else None
        )
        """The ``tasks`` participant (``None`` when no saga has a human task)."""
        self.notify_to: set[str] = set()
        """The participants a notification may go to (set by :meth:`beside`)."""
        self._clock, self._session, self._enqueue = clock, session, enqueue
        self._signer, self._partition_of = signer, partition_of

    def __call__(self, *, role: str = "", user: str = "", context: str | None = None) -> builtins.list[Task]:
        """The open tasks of ``role`` or ``user``, soonest due first."""
        return self._run(self.client.list(role=role, user=user, context=context))

    def show(self, task_id: str) -> Task:
        """The task, in whatever state (:class:`~saga.errors.TaskNotFound`)."""
        return self._run(self.client.show(task_id))

    def claim(self, task_id: str, *, by: str) -> Task:
        """``by`` claims the task (for the client's claim time on the virtual clock)."""
        return self._run(self.client.claim(task_id, by=by))

    def release(self, task_id: str, *, by: str) -> Task:
        """``by`` gives the claim back."""
        return self._run(self.client.release(task_id, by=by))

    def complete(self, task_id: str, answer: object, *, by: str) -> Task:
        """``by`` answers the task; the saga sees the answer on the next run."""
        return self._run(self.client.complete(task_id, answer, by=by))

    def reassign(self, task_id: str, to: Assignee, *, by: str) -> Task:
        """``by`` gives the task to another role or user."""
        return self._run(self.client.reassign(task_id, to, by=by))

    def log(self, saga_id: str) -> builtins.list[TaskLog]:
        """Every task action of the saga, oldest first (who, what, when)."""
        return self._run(self.client.log(saga_id))

    # -- the runner's side -----------------------------------------------------------------

    def beside(self, given: dict[str, FakeParticipant]) -> dict[str, FakeParticipant]:
        """The runner's participants ``given``, with the ``tasks`` participant if any saga has tasks."""
        if self.participant is not None:
            given = {**given, **participants_of([self.participant])}
        self.notify_to = set(given)
        return given

    def fire_due(self) -> int:
        """Fire the reminders and escalation steps due now (inside a run); how many fired."""
        if not self.contexts:
            return 0
        fired = self._session.wait(self.client.fire_due())
        self.carry()
        return fired

    def next_due(self) -> int | None:
        """When the next task timer is due."""
        due = [self.store.timers.get(p.tag, {}) for p in self.client.partitions() if self.contexts]
        return min((at for timers in due for at in timers.values()), default=None)

    def carry(self) -> None:
        """Queue what the inbox's writes sent, as the streams would deliver it."""
        sent, self.store.sent[:] = list(self.store.sent), []
        for stream, envelope in sent:
            saga_id = envelope.correlation_id
            partition = self._partition_of(saga_id)
            if envelope.type == SIGNAL:
                token = signal_token(envelope)
                self._signer(partition.context).verify(token, now_ms=self._clock.now_ms())
                self._enqueue(EventItem(saga_id, to_event(envelope)))
                continue
            self.notices.append(_notice.decode(envelope.payload))
            for name in self.notify_to:
                if stream == partition.commands(name):
                    self._enqueue(CommandItem(saga_id, partition, name, envelope))

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        found: list[T] = []
        self._session.run(lambda: found.append(self._session.wait(coroutine)))
        self.carry()
        return found[0]
