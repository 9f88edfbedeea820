"""The admin client: see what sagas do, and move stuck ones on, safely.

Everything ``saga inspect``, ``list``, ``replay``, ``force-complete``, ``cancel``, ``retry``,
``dlq``, ``export``, ``stats`` and ``start`` do is a method here; the CLI only parses
options and prints what these return::

    admin = SagaAdmin(redis, app)
    page = await admin.list(status="dead_lettered")
    print((await admin.inspect(page.rows[0].id)).waiting_for)
    await admin.retry(page.rows[0].id, reason="payments fixed (INC-42)")

Reads never change anything; they are :class:`~saga.ops.reader.SagaReader`'s, which this
client extends. Actions go through the saga's inbox and are decided by the orchestrator in
order with the replies racing them (see ``saga/ops/operator_actions.py``): each is judged
first by the same decider on the state just read, refused at once if it would not apply,
sent with the revision it was judged on, and awaited for ``wait_s`` seconds. An action that
loses a race is recorded and ignored, and raises :class:`~saga.errors.ActionRefused`.

No code is needed to read or act: :meth:`SagaAdmin.from_redis` reads the definitions'
registered shapes from Redis (a :class:`~saga.versions.catalogue.Catalogue`). Without the code an action is
judged on what the state shows and then by the orchestrator, which has it; starting,
replay, redrive and dry runs raise :class:`~saga.errors.CodeRequired`. A forced output is
checked against the step's output type first (``saga/ops/forced_output.py``).
"""

from __future__ import annotations

import builtins
import contextlib
import getpass
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from bus import Clock, LetterFilter, Publisher, Requeued, purge_dead_letters, requeue_dead_letters
from saga.core.decider import Decision
from saga.core.model import SagaState
from saga.core.task_rules import withdrawn
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.errors import CodeRequired, InvalidInput, TaskClosed, TaskNotFound
from saga.ops.forced_output import json_output, task_answer, typed_output
from saga.ops.operator_actions import Action, ActionResult, judge, judge_by_state, submit
from saga.ops.operator_actions import dry_run as preview_result
from saga.ops.reader import SagaReader
from saga.runtime.app import App
from saga.runtime.config import EngineConfig
from saga.runtime.protocol import CANCEL, FORCE, REDRIVE, RETRY, OperatorRequest
from saga.runtime.tasks import TaskEngine, task_id_of
from saga.store.keys import Partition
from saga.store.tasks import RedisTaskStore
from saga.versions.catalogue import Catalogue

OPERATOR_ENV = "REDSAGA_OPERATOR"
_json = msgspec.json.Encoder()


def default_operator() -> str:
    """Who is acting: ``$REDSAGA_OPERATOR``, else ``user@host``."""
    named = os.environ.get(OPERATOR_ENV)
    if named:
        return named
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = "operator"
    return f"{user}@{socket.gethostname()}"


class SagaAdmin(SagaReader):
    """Inspect, list, replay, export and operate the sagas of an app's definitions.

    ``definitions`` is the :class:`App` (its participants tell :meth:`stats` which command
    streams to read), a :class:`Registry`, or a :class:`Catalogue` (the definitions as
    Redis knows them, no code: see :meth:`from_redis`). ``participants`` adds command
    streams to :meth:`stats` in every context. ``by`` names the operator in the history of
    every action and start (default ``$REDSAGA_OPERATOR`` or ``user@host``); ``wait_s`` is
    how long an action waits for the orchestrator's decision (0: send and return at once).
    """

    def __init__(
        self,
        redis: Any,
        definitions: App | Registry | Catalogue,
        *,
        clock: Clock | None = None,
        config: EngineConfig | None = None,
        by: str | None = None,
        wait_s: float = 10.0,
        participants: Iterable[str] = (),
    ) -> None:
        super().__init__(redis, definitions, clock=clock, config=config, participants=participants)
        self.by = by or default_operator()
        self.wait_s = wait_s
        self._publisher = Publisher(
            redis, source="admin", config=self.config.bus, auth=self.config.auth, principal=self.principal
        )

    @classmethod
    async def from_redis(
        cls,
        redis: Any,
        definitions: App | Registry | None = None,
        *,
        clock: Clock | None = None,
        config: EngineConfig | None = None,
        by: str | None = None,
        wait_s: float = 10.0,
        participants: Iterable[str] = (),
    ) -> SagaAdmin:
        """An admin client on the definitions registered in Redis, no code needed.

        Workers register every definition version's shape, its context's partition count
        and the participants they run; that is enough to read, list, count, export, handle
        dead letters, cancel, retry and force-complete. ``definitions`` adds their code
        (for start, replay and redrive); Redis adds what the code does not define.
        """
        loaded = await Catalogue.load(redis)
        admin = cls(
            redis,
            loaded if definitions is None else definitions,
            clock=clock,
            config=config,
            by=by,
            wait_s=wait_s,
            participants=participants,
        )
        if definitions is not None:
            admin.catalogue = admin.catalogue.merge(loaded)
        return admin

    # -- acting --------------------------------------------------------------------------------

    async def start(
        self,
        definition: str | Saga[Any],
        data: object,
        *,
        saga_id: str | None = None,
        wait_s: float | None = None,
    ) -> str:
        """Start a saga of ``definition`` (a saga, ``name`` or ``name@version``) with ``data``.

        ``data`` is the data object, or its JSON (bytes or text), validated against the
        definition's data type before anything is written. The history records the start
        as by this admin's operator. With ``saga_id`` the start is idempotent: an existing
        saga with equal data is returned, one with other data raises :class:`StartConflict`.
        A start by request (signing on, no orchestrator keyring here) waits up to ``wait_s``
        (default: this client's) for the orchestrator's verdict, as
        :meth:`SagaClient.start <saga.SagaClient.start>` does.
        """
        saga = definition if isinstance(definition, Saga) else self._named(definition)
        if isinstance(data, bytes | str):
            try:
                data = msgspec.json.decode(data, type=saga.data_type)
            except msgspec.DecodeError as error:  # ValidationError included
                raise InvalidInput(f"data is not a valid {saga.data_type.__name__}: {error}") from error
        wait = self.wait_s if wait_s is None else wait_s
        return await self.client.start(saga, data, saga_id=saga_id, by=self.by, wait_s=wait)

    async def cancel(
        self, saga_id: str, *, reason: str = "", context: str | None = None, wait_s: float | None = None
    ) -> ActionResult:
        """Cancel the saga: completed steps are compensated in reverse order."""
        return await self._act(
            "cancel", CANCEL, saga_id, OperatorRequest(reason=reason), context=context, wait_s=wait_s
        )

    async def retry(
        self, saga_id: str, *, reason: str = "", context: str | None = None, wait_s: float | None = None
    ) -> ActionResult:
        """Retry a dead-lettered saga's failed step (or compensation) now."""
        return await self._act(
            "retry", RETRY, saga_id, OperatorRequest(reason=reason), context=context, wait_s=wait_s
        )

    async def force_complete(
        self,
        saga_id: str,
        step: str,
        output: object,
        *,
        reason: str,
        context: str | None = None,
        wait_s: float | None = None,
        dry_run: bool = False,
    ) -> ActionResult:
        """Mark a stuck or dead-lettered step (or its failed compensation) done with ``output``.

        ``output`` (an object, or its JSON as bytes or text) is validated against the step's
        output type before anything is sent; a ``reason`` is required and recorded with the
        operator's name in the history. The saga then continues from that step. For a saga
        waiting on a human task, ``step`` is the task's name and ``output`` its form's answer;
        once that is applied the task is withdrawn from the inbox (nobody answers it again).
        """
        if not reason.strip():
            raise InvalidInput("force-complete needs a reason (it is recorded in the history)")
        partition, state, _ = await self._read(saga_id, context)
        shape = self.catalogue.shape_or_none(state.name, state.version)
        if shape is None:
            raise CodeRequired("force-complete", f"{state.name}@{state.version}")
        task, (step, output) = step, task_answer(state, step, output, by=self.by)
        raw = json_output(shape, step, output)
        # The decider's verdict first (is this the step to force, now?), then the output type.
        await self._judge(
            "force-complete", FORCE, state, OperatorRequest(reason=reason, step=step, output=raw)
        )
        typed = typed_output(self._code(state), shape, state, step, raw)
        request = OperatorRequest(reason=reason, step=step, output=msgspec.Raw(typed))
        result = await self._send(
            "force-complete", FORCE, partition, state, request, wait_s=wait_s, dry_run=dry_run
        )
        if step != task and result.outcome == "applied":
            await self._withdraw_task(state, task, f"answered by force-complete ({self.by}: {reason})")
        return result

    async def redrive(
        self,
        saga_id: str,
        from_step: str,
        *,
        reason: str,
        context: str | None = None,
        wait_s: float | None = None,
        dry_run: bool = False,
    ) -> ActionResult:
        """Re-run a stuck saga from ``from_step``, keeping the outputs of the steps before it.

        Allowed while the saga runs, waits or is dead-lettered on a forward step, from a step
        it has reached; the rules, and why a step's effect is never applied twice, are in
        ``docs/operations.md``. ``dry_run`` reports what would be sent and sends nothing.
        """
        if not reason.strip():
            raise InvalidInput("a redrive needs a reason (it is recorded in the history)")
        partition, state, _ = await self._read(saga_id, context)
        self._definition(state, "a redrive")
        request = OperatorRequest(reason=reason, step=from_step)
        return await self._send("redrive", REDRIVE, partition, state, request, wait_s=wait_s, dry_run=dry_run)

    # -- dead letters --------------------------------------------------------------------------

    async def requeue_dead_letters(
        self, where: LetterFilter, *, context: str | None = None, tags: Sequence[str] = ()
    ) -> builtins.list[Requeued]:
        """Put the matching letters' entries back on their streams (safe to repeat).

        Letters named by id must exist: ``KeyError`` names the first that does not, and
        nothing is requeued.
        """
        letters = await self.dead_letters(where, context=context, tags=tags, limit=None)
        found = {letter.id for letter in letters}
        missing = [i for i in where.ids if i not in found]
        if missing:
            raise KeyError(f"no dead letter {missing[0]!r}")
        return await requeue_dead_letters(self.redis, letters)

    async def purge_dead_letters(
        self, where: LetterFilter, *, context: str | None = None, tags: Sequence[str] = ()
    ) -> int:
        """Delete the matching letters; return how many were deleted."""
        letters = await self.dead_letters(where, context=context, tags=tags, limit=None)
        return await purge_dead_letters(self.redis, letters)

    # -- helpers -------------------------------------------------------------------------------

    async def _act(
        self,
        name: str,
        kind: str,
        saga_id: str,
        request: OperatorRequest,
        *,
        context: str | None,
        wait_s: float | None,
    ) -> ActionResult:
        partition, state, _ = await self._read(saga_id, context)
        return await self._send(name, kind, partition, state, request, wait_s=wait_s, dry_run=False)

    async def _send(
        self,
        name: str,
        kind: str,
        partition: Partition,
        state: SagaState,
        request: OperatorRequest,
        *,
        wait_s: float | None,
        dry_run: bool,
    ) -> ActionResult:
        action, judged = await self._judge(name, kind, state, request)
        size, limit = len(_json.encode(request)), self.config.bus.max_payload_bytes
        if size > limit:
            raise InvalidInput(f"the {name} request is {size} bytes, over the {limit}-byte payload limit")
        if dry_run:
            if judged is None:
                raise CodeRequired(f"a dry run of {name}", f"{state.name}@{state.version}")
            return preview_result(action, state, judged)
        return await submit(
            self.redis,
            self._publisher,
            partition,
            state,
            action,
            judged=judged,
            source=f"admin:{self.by}",
            wait_s=self.wait_s if wait_s is None else wait_s,
        )

    async def _withdraw_task(self, state: SagaState, name: str, reason: str) -> None:
        """Withdraw the open task ``name`` whose wait an operator answered (a repeat changes nothing)."""
        assert state.wait is not None  # noqa: S101 - the task's wait, which was just answered
        task_id = task_id_of(state.context, state.partition, state.id, name, state.wait.n)
        store, source = RedisTaskStore(self.redis), f"admin:{self.by}"
        engine = TaskEngine(store, self.clock, self._publisher, source=source)
        with contextlib.suppress(TaskClosed, TaskNotFound):  # answered, or gone with its saga, meanwhile
            await engine.apply(task_id, lambda task, now: withdrawn(task, now, reason))

    async def _judge(
        self, name: str, kind: str, state: SagaState, request: OperatorRequest
    ) -> tuple[Action, Decision | None]:
        """The action as the orchestrator will see it, and the decider's verdict on ``state``.

        Without the definition's code, only what the state shows is judged here (``None``).
        """
        request.by, request.revision = self.by, state.revision
        action = Action.of(name, kind, request, at_ms=self.clock.now_ms())
        definition = self._code(state)
        if definition is None:
            judge_by_state(state, action)
            return action, None
        signer = await self._signer(definition, state, exact=False)
        return action, judge(definition, state, action, signer=signer)

    def _named(self, reference: str) -> Saga[Any]:
        name, _, version = reference.partition("@")
        if self.registry is None:
            raise CodeRequired("starting a saga", reference)
        if not version:
            return self.registry.latest(name)
        try:
            return self.registry.get(name, int(version))
        except ValueError:
            raise InvalidInput(f"{reference!r} is not name or name@version") from None
