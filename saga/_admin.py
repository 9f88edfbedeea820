"""The admin client: see what sagas do, and move stuck ones on, safely.

Everything ``saga inspect``, ``list``, ``replay``, ``force-complete``, ``cancel``, ``retry``,
``dlq``, ``export``, ``stats`` and ``start`` do is a method here; the CLI only parses
options and prints what these return::

    admin = SagaAdmin(redis, app)
    page = await admin.list(status="dead_lettered")
    print((await admin.inspect(page.rows[0].id)).waiting_for)
    await admin.retry(page.rows[0].id, reason="payments fixed (INC-42)")

Reads never change anything. Actions go through the saga's inbox and are decided by the
orchestrator in order with the replies racing them (see ``saga/_operator.py``): each is
judged first by the same decider on the state just read, refused at once if it would not
apply, sent with the revision it was judged on, and awaited for ``wait_s`` seconds. An
action that loses a race is recorded and ignored, and raises :class:`~saga.ActionRefused`.
"""

from __future__ import annotations

import builtins
import getpass
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from bus import (
    Clock,
    DeadLetter,
    LetterFilter,
    Publisher,
    Requeued,
    Stream,
    SystemClock,
    dead_letters,
    purge_dead_letters,
    requeue_dead_letters,
    tagged_key,
)
from bus._errors import redis_errors
from saga._app import App
from saga._branch_store import decode_branches
from saga._client import SagaClient
from saga._config import EngineConfig
from saga._decider import Decision
from saga._definition import LOCAL, Context, Saga
from saga._errors import InvalidInput, SagaError, SagaNotFound, UnknownDefinition
from saga._inspect import Inspection, TimerView, build_inspection
from saga._keys import Partition, partition_of
from saga._listing import Query, SagaPage, count_sagas, list_sagas
from saga._model import HistoryEntry, SagaState
from saga._operator import Action, ActionResult, judge, submit
from saga._operator import dry_run as preview_result
from saga._protocol import CANCEL, FORCE, REDRIVE, RETRY, OperatorRequest
from saga._registry import Registry
from saga._replay import ReplayReport, decode_entries, replay_history
from saga._states import SagaStatus, StepStatus
from saga._stats import SagaCount, Stats, gather, saga_counts
from saga._store import TimerTemplate, decode_state
from saga._tokens import Signer
from saga._trace import Trace

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


_STAND_IN_KEY = b"redsaga: predicting commands, never sent"


class SagaAdmin:
    """Inspect, list, replay, export and operate the sagas of an app's definitions.

    ``definitions`` is the :class:`App` (its participants tell :meth:`stats` which command
    streams to read) or a :class:`Registry`. ``by`` names the operator in the history of
    every action (default ``$REDSAGA_OPERATOR`` or ``user@host``); ``wait_s`` is how long an
    action waits for the orchestrator's decision (0: send and return at once).
    """

    def __init__(
        self,
        redis: Any,
        definitions: App | Registry,
        *,
        clock: Clock | None = None,
        config: EngineConfig | None = None,
        by: str | None = None,
        wait_s: float = 10.0,
        participants: Iterable[str] = (),
    ) -> None:
        self.redis = redis
        self.registry = definitions.registry if isinstance(definitions, App) else definitions
        self.clock = clock or SystemClock()
        self.config = config or EngineConfig()
        self.by = by or default_operator()
        self.wait_s = wait_s
        app_participants = definitions.participants if isinstance(definitions, App) else []
        self._participants = {p.name: p.serves for p in app_participants}
        for name in participants:
            self._participants.setdefault(name, list(self.registry.contexts.values()))
        auth = self.config.auth
        principal = auth.signer_for("operator", "orchestrator")
        self.client = SagaClient(
            redis, self.registry, clock=self.clock, config=self.config, source="admin", principal=principal
        )
        self._publisher = Publisher(
            redis, source="admin", config=self.config.bus, auth=auth, principal=principal
        )

    # -- reading -----------------------------------------------------------------------------

    async def get(self, saga_id: str, *, context: str | None = None) -> SagaState:
        """The saga's current state (:class:`SagaNotFound` if no context holds it)."""
        return (await self._read(saga_id, context))[1]

    async def history(self, saga_id: str, *, context: str | None = None) -> list[HistoryEntry]:
        """Every history entry of the saga, oldest first."""
        return (await self._read(saga_id, context))[2]

    async def inspect(self, saga_id: str, *, context: str | None = None, history: bool = False) -> Inspection:
        """The saga explained: where it is, what it waits for, every attempt, timers, errors.

        ``history`` adds the full history entries (the timeline summarises them anyway).
        """
        partition, state, entries = await self._read(saga_id, context)
        now = await self.now_ms()
        letters = await dead_letters(
            self.redis, [tagged_key(partition.tag, "dlq")], LetterFilter(correlation_id=saga_id), limit=20
        )
        return build_inspection(
            state,
            entries,
            await self._timers(partition, state, now),
            letters,
            now_ms=now,
            definition=self._definition_or_none(state),
            full_history=history,
        )

    async def list(
        self,
        *,
        status: str | SagaStatus | Sequence[str | SagaStatus] = (),
        definition: str | None = None,
        version: int | None = None,
        context: str | None = None,
        stuck_for_ms: int | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> SagaPage:
        """A page of sagas by status, definition and version; or those stuck for a while.

        With ``stuck_for_ms``, only sagas that have not moved for that long are listed,
        stalest first (from the ``active`` index); otherwise oldest in their status first.
        """
        if limit < 1 or offset < 0:
            raise InvalidInput("limit must be positive and offset not negative")
        query = _query(status, definition, version, stuck_for_ms)
        now = await self.now_ms()
        return await list_sagas(
            self.redis, self._partitions(context), query, now_ms=now, offset=offset, limit=limit
        )

    async def count(
        self,
        *,
        status: str | SagaStatus | Sequence[str | SagaStatus] = (),
        definition: str | None = None,
        version: int | None = None,
        context: str | None = None,
        stuck_for_ms: int | None = None,
    ) -> int:
        """How many sagas :meth:`list` would list over all its pages."""
        query = _query(status, definition, version, stuck_for_ms)
        if stuck_for_ms is None:
            rows = await self.counts(context=context)
            return sum(r.count for r in rows if query.accepts_count(r.definition, r.version, r.status))
        return await count_sagas(self.redis, self._partitions(context), query, now_ms=await self.now_ms())

    async def counts(self, *, context: str | None = None) -> builtins.list[SagaCount]:
        """Sagas per definition, version and status (from the counters)."""
        return await saga_counts(self.redis, self._partitions(context))

    async def export(self, saga_id: str, *, context: str | None = None) -> Trace:
        """The saga's trace: definition version, input data, every event with its outputs."""
        partition, state, entries = await self._read(saga_id, context)
        definition = self._definition_or_none(state)
        return Trace(
            saga_id=saga_id,
            definition=state.name,
            version=state.version,
            context=state.context,
            partition=partition.index,
            steps=[s.name for s in definition.steps] if definition else list(state.steps),
            data=state.data,
            exported_at_ms=await self.now_ms(),
            state=state,
            history=entries,
        )

    async def replay(self, saga_id: str, *, context: str | None = None) -> ReplayReport:
        """Rebuild the saga from its history through today's decider; report the first difference.

        No participant is called and nothing is written: the determinism check after a code
        change. To re-run a stuck saga from a step, see :meth:`redrive`.
        """
        partition, state, entries = await self._read(saga_id, context)
        definition = self._definition(state)
        signer = await self._signer(definition, state, exact=True)
        return replay_history(definition, entries, saga_id=saga_id, partition=partition.index, signer=signer)

    async def stats(
        self,
        *,
        context: str | None = None,
        stuck_for_ms: int = 600_000,
        dsns: Sequence[str] = (),
        streams: Sequence[str] = (),
    ) -> Stats:
        """Sagas per definition, version and status; queues; dead letters; stuck; outboxes.

        Streams read: each partition's inbox, its local-action stream, the command stream of
        every participant the app declares, and ``streams`` (keys) besides.
        """
        partitions = self._partitions(context)
        read = [p.inbox for p in partitions]
        for partition in partitions:
            read.append(partition.commands(LOCAL))
            read += [
                partition.commands(name)
                for name, serves in sorted(self._participants.items())
                if any(c.name == partition.context for c in serves)
            ]
        read += [Stream.from_key(key) for key in streams]
        return await gather(
            self.redis, partitions, read, now_ms=await self.now_ms(), stuck_for_ms=stuck_for_ms, dsns=dsns
        )

    # -- acting --------------------------------------------------------------------------------

    async def start(self, definition: str | Saga[Any], data: object, *, saga_id: str | None = None) -> str:
        """Start a saga of ``definition`` (a saga, ``name`` or ``name@version``) with ``data``.

        ``data`` is the data object, or its JSON (bytes or text), validated against the
        definition's data type before anything is written.
        """
        saga = definition if isinstance(definition, Saga) else self._named(definition)
        if isinstance(data, bytes | str):
            try:
                data = msgspec.json.decode(data, type=saga.data_type)
            except msgspec.DecodeError as error:  # ValidationError included
                raise InvalidInput(f"data is not a valid {saga.data_type.__name__}: {error}") from error
        return await self.client.start(saga, data, saga_id=saga_id)

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
        operator's name in the history. The saga then continues from that step.
        """
        if not reason.strip():
            raise InvalidInput("force-complete needs a reason (it is recorded in the history)")
        partition, state, _ = await self._read(saga_id, context)
        definition = self._definition(state)
        raw = _json_output(definition, step, output)
        # The decider's verdict first (is this the step to force, now?), then the output type.
        await self._judge(
            "force-complete", FORCE, state, OperatorRequest(reason=reason, step=step, output=raw)
        )
        typed = _typed_output(definition, state, step, raw)
        request = OperatorRequest(reason=reason, step=step, output=msgspec.Raw(typed))
        return await self._send(
            "force-complete", FORCE, partition, state, request, wait_s=wait_s, dry_run=dry_run
        )

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
        request = OperatorRequest(reason=reason, step=from_step)
        return await self._send("redrive", REDRIVE, partition, state, request, wait_s=wait_s, dry_run=dry_run)

    # -- dead letters --------------------------------------------------------------------------

    def dead_letter_streams(
        self, *, context: str | None = None, tags: Sequence[str] = ()
    ) -> builtins.list[str]:
        """The dead-letter streams of the context's partitions (or of the given hash tags)."""
        if tags:
            return [tagged_key(tag, "dlq") for tag in tags]
        return [tagged_key(p.tag, "dlq") for p in self._partitions(context)]

    async def dead_letters(
        self,
        where: LetterFilter | None = None,
        *,
        context: str | None = None,
        tags: Sequence[str] = (),
        limit: int | None = 100,
    ) -> builtins.list[DeadLetter]:
        """The letters matching ``where`` (all when ``None``), oldest first."""
        streams = self.dead_letter_streams(context=context, tags=tags)
        return await dead_letters(self.redis, streams, where, limit=limit)

    async def dead_letter(
        self, letter_id: str, *, context: str | None = None, tags: Sequence[str] = ()
    ) -> DeadLetter:
        """One letter by id (``KeyError`` naming it when no dead-letter stream holds it)."""
        found = await self.dead_letters(LetterFilter(ids=(letter_id,)), context=context, tags=tags)
        if not found:
            raise KeyError(f"no dead letter {letter_id!r}")
        return found[0]

    async def requeue_dead_letters(
        self, where: LetterFilter, *, context: str | None = None, tags: Sequence[str] = ()
    ) -> builtins.list[Requeued]:
        """Put the matching letters' entries back on their streams (safe to repeat)."""
        letters = await self.dead_letters(where, context=context, tags=tags, limit=None)
        return await requeue_dead_letters(self.redis, letters)

    async def purge_dead_letters(
        self, where: LetterFilter, *, context: str | None = None, tags: Sequence[str] = ()
    ) -> int:
        """Delete the matching letters; return how many were deleted."""
        letters = await self.dead_letters(where, context=context, tags=tags, limit=None)
        return await purge_dead_letters(self.redis, letters)

    # -- helpers -------------------------------------------------------------------------------

    async def now_ms(self) -> int:
        """Now, by the clock the engine's indexes use (Redis ``TIME`` unless a test clock is set)."""
        scripted = self.clock.script_now_ms()
        if scripted >= 0:
            return scripted
        with redis_errors():
            seconds, micros = await self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

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
            return preview_result(action, judged)
        return await submit(
            self.redis,
            self._publisher,
            partition,
            judged,
            action,
            source=f"admin:{self.by}",
            wait_s=self.wait_s if wait_s is None else wait_s,
        )

    async def _judge(
        self, name: str, kind: str, state: SagaState, request: OperatorRequest
    ) -> tuple[Action, Decision]:
        """The action as the orchestrator will see it, and the decider's verdict on ``state``."""
        request.by, request.revision = self.by, state.revision
        action = Action.of(name, kind, request, at_ms=self.clock.now_ms())
        definition = self._definition(state)
        return action, judge(
            definition, state, action, signer=await self._signer(definition, state, exact=False)
        )

    async def _signer(self, definition: Saga[Any], state: SagaState, *, exact: bool) -> Signer | None:
        """The context's signer when the saga's builders may make resume tokens (the decider needs it).

        With signing on only the orchestrator can make tokens. Judging an action predicts
        its commands with a stand-in key then (their tokens are not sent); a replay, which
        compares commands byte for byte, needs the real one and says so.
        """
        if not definition.takes_signals:
            return None
        if self.client.can_make_tokens(state.context):
            return await self.client.signer(state.context)
        if exact:
            raise SagaError(
                f"replaying {definition.key} needs the orchestrator keyring of context {state.context!r} "
                "(REDSAGA_KEYRING): its builders put resume tokens in commands"
            )
        return Signer.from_secret(_STAND_IN_KEY, state.context)

    async def _read(
        self, saga_id: str, context: str | None
    ) -> tuple[Partition, SagaState, builtins.list[HistoryEntry]]:
        """State and history of the saga, read together (one MULTI), from whichever context holds it."""
        for ctx in self._contexts(context):
            partition = Partition(ctx.name, partition_of(saga_id, ctx.partitions))
            with redis_errors():
                async with self.redis.pipeline(transaction=True) as pipe:
                    pipe.hgetall(partition.saga(saga_id))
                    pipe.lrange(partition.history(saga_id), 0, -1)
                    pipe.hgetall(partition.branches(saga_id))
                    raw, history, branches = await pipe.execute()
            if raw:
                state = decode_state(saga_id, raw).state
                state.branches = decode_branches(branches)
                return partition, state, decode_entries(history)
        raise SagaNotFound(saga_id)

    async def _timers(self, partition: Partition, state: SagaState, now_ms: int) -> builtins.list[TimerView]:
        ids = [s.timer for s in [*state.steps.values(), *state.branches.values()] if s.timer]
        views = []
        with redis_errors():
            for timer_id in ids:
                due = await self.redis.zscore(partition.timers, timer_id)
                data = await self.redis.hget(partition.timer_data, timer_id)
                if data is None:
                    continue  # fired already: the event is in the inbox
                _, template = TimerTemplate.parse(timer_id, data)
                views.append(
                    TimerView(
                        timer_id=timer_id,
                        purpose=template.purpose,
                        step=template.step,
                        kind=template.kind,
                        attempt=template.attempt,
                        due_ms=int(due) if due is not None else None,
                        due_in_ms=int(due) - now_ms if due is not None else None,
                    )
                )
        return views

    def _contexts(self, context: str | None) -> builtins.list[Context]:
        if context is not None:
            return [self.registry.context(context)]
        return list(self.registry.contexts.values())

    def _partitions(self, context: str | None) -> builtins.list[Partition]:
        return [Partition(c.name, i) for c in self._contexts(context) for i in range(c.partitions)]

    def _definition(self, state: SagaState) -> Saga[Any]:
        return self.registry.get(state.name, state.version)

    def _definition_or_none(self, state: SagaState) -> Saga[Any] | None:
        try:
            return self._definition(state)
        except UnknownDefinition:
            return None

    def _named(self, reference: str) -> Saga[Any]:
        name, _, version = reference.partition("@")
        if not version:
            return self.registry.latest(name)
        try:
            return self.registry.get(name, int(version))
        except ValueError:
            raise InvalidInput(f"{reference!r} is not name or name@version") from None


def _query(
    status: str | SagaStatus | Sequence[str | SagaStatus],
    definition: str | None,
    version: int | None,
    stuck_for_ms: int | None,
) -> Query:
    statuses = [status] if isinstance(status, str) else list(status)
    try:
        parsed = tuple(SagaStatus(s) for s in statuses)
    except ValueError:
        known = ", ".join(s.value for s in SagaStatus)
        raise InvalidInput(f"unknown status in {statuses} (known: {known})") from None
    if stuck_for_ms is not None and stuck_for_ms < 0:
        raise InvalidInput("stuck_for_ms must not be negative")
    return Query(statuses=parsed, definition=definition, version=version, stuck_for_ms=stuck_for_ms)


def _json_output(definition: Saga[Any], step_name: str, output: object) -> msgspec.Raw:
    """The output as JSON, for a step of ``definition`` (:class:`InvalidInput` if not)."""
    try:
        definition.step_named(step_name)
    except KeyError:
        names = ", ".join(s.name for s in definition.steps)
        raise InvalidInput(f"unknown step {step_name!r} in {definition.key} (steps: {names})") from None
    if not isinstance(output, bytes | str):
        return msgspec.Raw(_json.encode(output))
    raw = output.encode() if isinstance(output, str) else output
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError as error:
        raise InvalidInput(f"the output is not valid JSON: {error}") from error
    return msgspec.Raw(raw)


def _typed_output(definition: Saga[Any], state: SagaState, step_name: str, raw: msgspec.Raw) -> bytes:
    """The output as canonical JSON, checked against the step's output type.

    A failed compensation takes any JSON. :class:`InvalidInput` says what is wrong, before
    anything is sent.
    """
    step = definition.step_named(step_name)
    record = state.branches.get(step_name) if "#" in step_name else state.steps.get(step.name)
    if record is not None and record.status in (StepStatus.COMPENSATION_FAILED, StepStatus.CONFIRM_FAILED):
        return _json.encode(msgspec.json.decode(raw))
    if step.output_type is None:
        if msgspec.json.decode(raw) is not None:
            raise InvalidInput(f"{definition.key}.{step.name} has no output: give null")
        return b"null"
    try:
        typed = msgspec.json.decode(raw, type=step.output_type)
    except msgspec.ValidationError as error:
        name = getattr(step.output_type, "__name__", str(step.output_type))
        raise InvalidInput(
            f"the output is not a valid {name} for {definition.key}.{step.name}: {error}"
        ) from error
    return _json.encode(typed)
