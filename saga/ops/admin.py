"""The admin client: see what sagas do, and move stuck ones on, safely.

Everything ``saga inspect``, ``list``, ``replay``, ``force-complete``, ``cancel``, ``retry``,
``dlq``, ``export``, ``stats`` and ``start`` do is a method here; the CLI only parses
options and prints what these return::

    admin = SagaAdmin(redis, app)
    page = await admin.list(status="dead_lettered")
    print((await admin.inspect(page.rows[0].id)).waiting_for)
    await admin.retry(page.rows[0].id, reason="payments fixed (INC-42)")

Reads never change anything. Actions go through the saga's inbox and are decided by the
orchestrator in order with the replies racing them (see ``saga/ops/operator_actions.py``): each is
judged first by the same decider on the state just read, refused at once if it would not
apply, sent with the revision it was judged on, and awaited for ``wait_s`` seconds. An
action that loses a race is recorded and ignored, and raises :class:`~saga.errors.ActionRefused`.

No code is needed to read or act: :meth:`SagaAdmin.from_redis` reads the definitions'
registered shapes from Redis (a :class:`~saga.versions.catalogue.Catalogue`). Without the code an action is
judged on what the state shows and then by the orchestrator, which has it; starting,
replay, redrive and dry runs raise :class:`~saga.errors.CodeRequired`.
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
)
from bus.lowlevel import redis_errors
from saga.core.decider import Decision
from saga.core.model import HistoryEntry, SagaState
from saga.core.replay import ReplayReport, decode_entries, replay_history
from saga.core.states import SagaStatus, StepStatus
from saga.core.tokens import Signer
from saga.definition.registry import Registry
from saga.definition.saga import LOCAL, Context, Saga
from saga.definition.shape import Shape
from saga.errors import CodeRequired, InvalidInput, SagaError, SagaNotFound, UnknownDefinition
from saga.ops.graph import Format as GraphFormat
from saga.ops.graph import path_graph
from saga.ops.inspect import Inspection, TimerView, build_inspection
from saga.ops.listing import Query, SagaPage, list_sagas, matching_rows
from saga.ops.operator_actions import Action, ActionResult, judge, judge_by_state, submit
from saga.ops.operator_actions import dry_run as preview_result
from saga.ops.stats import SagaCount, SagaTally, Stats, gather, saga_counts
from saga.ops.trace import Trace
from saga.runtime.app import App
from saga.runtime.client import SagaClient
from saga.runtime.config import EngineConfig
from saga.runtime.protocol import CANCEL, FORCE, REDRIVE, RETRY, OperatorRequest
from saga.store.branches import decode_branches
from saga.store.codec import decode_state
from saga.store.commit import TimerTemplate
from saga.store.keys import Partition, PartitionKeys, partition_of
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


_STAND_IN_KEY = b"redsaga: predicting commands, never sent"


class SagaAdmin:
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
        self.redis = redis
        self.registry: Registry | None = None
        """The definitions' code (``None``: only the catalogue is known)."""
        if isinstance(definitions, Catalogue):
            self.catalogue = definitions
        else:
            self.registry = definitions.registry if isinstance(definitions, App) else definitions
            served: dict[str, list[str]] = {}
            for p in definitions.participants if isinstance(definitions, App) else []:
                for context in p.serves:
                    served.setdefault(context.name, []).append(p.name)
            self.catalogue = Catalogue.of(self.registry, served)
        self.clock = clock or SystemClock()
        self.config = config or EngineConfig()
        self.by = by or default_operator()
        self.wait_s = wait_s
        self._extra_participants = list(participants)
        auth = self.config.auth
        principal = auth.signer_for("operator", "orchestrator")
        self.client = SagaClient(
            redis,
            self.registry or Registry([]),
            clock=self.clock,
            config=self.config,
            source="admin",
            principal=principal,
        )
        self._publisher = Publisher(
            redis, source="admin", config=self.config.bus, auth=auth, principal=principal
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

    # -- reading -----------------------------------------------------------------------------

    async def get(self, saga_id: str, *, context: str | None = None) -> SagaState:
        """The saga's current state (:class:`SagaNotFound` if no context holds it)."""
        return (await self._read(saga_id, context))[1]

    async def history(self, saga_id: str, *, context: str | None = None) -> list[HistoryEntry]:
        """Every history entry of the saga, oldest first."""
        return (await self._read(saga_id, context))[2]

    async def inspect(
        self,
        saga_id: str,
        *,
        context: str | None = None,
        history: bool = False,
        graph: GraphFormat | None = None,
    ) -> Inspection:
        """The saga explained: where it is, what it waits for, every attempt, timers, errors.

        ``history`` adds the full history entries (the timeline summarises them anyway);
        ``graph`` draws the saga's path over its definition's diagram (from the code, or
        else from the shape registered in Redis).
        """
        partition, state, entries = await self._read(saga_id, context)
        shape = self.catalogue.shape_or_none(state.name, state.version)
        drawn = self._code(state) or shape
        if graph and drawn is None:
            raise CodeRequired("a graph", f"{state.name}@{state.version}")
        diagram = path_graph(drawn, state, graph) if graph and drawn is not None else None
        now = await self.now_ms()
        letters = await dead_letters(
            self.redis, [partition.dead_letters], LetterFilter(correlation_id=saga_id), limit=20
        )
        found = build_inspection(
            state,
            entries,
            await self._timers(partition, state, now),
            letters,
            now_ms=now,
            shape=shape,
            full_history=history,
        )
        found.graph = diagram
        return found

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
        stalest first (from the ``active`` index), leaving out those waiting within their
        wait's deadline (counted in ``waiting``); otherwise oldest in their status first.
        ``total`` counts every page. An unknown ``definition`` raises
        :class:`UnknownDefinition`.
        """
        if limit < 1 or offset < 0:
            raise InvalidInput("limit must be positive and offset not negative")
        query = _query(status, definition, version, stuck_for_ms)
        partitions = self._partitions(context)
        counts = await saga_counts(self.redis, partitions)
        self._check_named(definition, counts)
        total = None if stuck_for_ms is not None else _total(counts, query)
        return await list_sagas(
            self.redis, partitions, query, now_ms=await self.now_ms(), offset=offset, limit=limit, total=total
        )

    async def tally(
        self,
        *,
        status: str | SagaStatus | Sequence[str | SagaStatus] = (),
        definition: str | None = None,
        version: int | None = None,
        context: str | None = None,
        stuck_for_ms: int | None = None,
    ) -> SagaTally:
        """How many sagas :meth:`list` would list over all its pages, per definition and status.

        From the counters; with ``stuck_for_ms``, from a walk of the ``active`` index.
        """
        query = _query(status, definition, version, stuck_for_ms)
        partitions = self._partitions(context)
        counts = await saga_counts(self.redis, partitions)
        self._check_named(definition, counts)
        if stuck_for_ms is None:
            kept = [c for c in counts if query.accepts_count(c.definition, c.version, c.status)]
            return SagaTally(total=sum(c.count for c in kept), counts=kept)
        rows, waiting = await matching_rows(self.redis, partitions, query, now_ms=await self.now_ms())
        grouped: dict[tuple[str, int, SagaStatus], int] = {}
        for row in rows:
            slot = (row.definition, row.version, row.status)
            grouped[slot] = grouped.get(slot, 0) + 1
        return SagaTally(
            total=len(rows),
            counts=[
                SagaCount(definition=name, version=v, status=st, count=n)
                for (name, v, st), n in sorted(grouped.items())
            ],
            stuck_for_ms=stuck_for_ms,
            waiting=waiting,
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
        tally = await self.tally(
            status=status, definition=definition, version=version, context=context, stuck_for_ms=stuck_for_ms
        )
        return tally.total

    async def counts(self, *, context: str | None = None) -> builtins.list[SagaCount]:
        """Sagas per definition, version and status (from the counters)."""
        return await saga_counts(self.redis, self._partitions(context))

    async def export(self, saga_id: str, *, context: str | None = None) -> Trace:
        """The saga's trace: definition version, input data, every event with its outputs."""
        partition, state, entries = await self._read(saga_id, context)
        shape = self.catalogue.shape_or_none(state.name, state.version)
        return Trace(
            saga_id=saga_id,
            definition=state.name,
            version=state.version,
            context=state.context,
            partition=partition.index,
            steps=[s.name for s in shape.steps] if shape else list(state.steps),
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
        definition = self._definition(state, "replay")
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
        every participant the catalogue knows for its context (the app's, or those workers
        registered), and ``streams`` (keys) besides. Consumers count as live when idle for
        less than the lease (``config.bus.lease_ms``).
        """
        partitions = self._partitions(context)
        read = [p.inbox for p in partitions]
        for partition in partitions:
            names = {*self.catalogue.participants(partition.context), *self._extra_participants}
            read.append(partition.commands(LOCAL))
            read += [partition.commands(name) for name in sorted(names)]
        read += [Stream.from_key(key) for key in streams]
        return await gather(
            self.redis,
            partitions,
            read,
            now_ms=await self.now_ms(),
            stuck_for_ms=stuck_for_ms,
            live_after_ms=self.config.bus.lease_ms,
            dsns=dsns,
        )

    # -- acting --------------------------------------------------------------------------------

    async def start(self, definition: str | Saga[Any], data: object, *, saga_id: str | None = None) -> str:
        """Start a saga of ``definition`` (a saga, ``name`` or ``name@version``) with ``data``.

        ``data`` is the data object, or its JSON (bytes or text), validated against the
        definition's data type before anything is written. The history records the start
        as by this admin's operator. With ``saga_id`` the start is idempotent: an existing
        saga with equal data is returned, one with other data raises :class:`StartConflict`.
        """
        saga = definition if isinstance(definition, Saga) else self._named(definition)
        if isinstance(data, bytes | str):
            try:
                data = msgspec.json.decode(data, type=saga.data_type)
            except msgspec.DecodeError as error:  # ValidationError included
                raise InvalidInput(f"data is not a valid {saga.data_type.__name__}: {error}") from error
        return await self.client.start(saga, data, saga_id=saga_id, by=self.by)

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
        shape = self.catalogue.shape_or_none(state.name, state.version)
        if shape is None:
            raise CodeRequired("force-complete", f"{state.name}@{state.version}")
        raw = _json_output(shape, step, output)
        # The decider's verdict first (is this the step to force, now?), then the output type.
        await self._judge(
            "force-complete", FORCE, state, OperatorRequest(reason=reason, step=step, output=raw)
        )
        typed = _typed_output(self._code(state), shape, state, step, raw)
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
        self._definition(state, "a redrive")
        request = OperatorRequest(reason=reason, step=from_step)
        return await self._send("redrive", REDRIVE, partition, state, request, wait_s=wait_s, dry_run=dry_run)

    # -- dead letters --------------------------------------------------------------------------

    def dead_letter_streams(
        self, *, context: str | None = None, tags: Sequence[str] = ()
    ) -> builtins.list[str]:
        """The dead-letter streams of the context's partitions (or of the given hash tags)."""
        if tags:
            return [PartitionKeys(tag).dead_letters for tag in tags]
        return [p.dead_letters for p in self._partitions(context)]

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
            if judged is None:
                raise CodeRequired(f"a dry run of {name}", f"{state.name}@{state.version}")
            return preview_result(action, judged)
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
            return [self.catalogue.context(context)]
        return list(self.catalogue.contexts.values())

    def _partitions(self, context: str | None) -> builtins.list[Partition]:
        return [Partition(c.name, i) for c in self._contexts(context) for i in range(c.partitions)]

    def _code(self, state: SagaState) -> Saga[Any] | None:
        """The definition ``state`` runs, when this client has its code."""
        try:
            return self.registry.get(state.name, state.version) if self.registry else None
        except UnknownDefinition:
            return None

    def _definition(self, state: SagaState, operation: str) -> Saga[Any]:
        """The definition ``state`` runs (:class:`CodeRequired` for ``operation`` without it)."""
        definition = self._code(state)
        if definition is None:
            raise CodeRequired(operation, f"{state.name}@{state.version}")
        return definition

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

    def _check_named(self, definition: str | None, counts: Sequence[SagaCount]) -> None:
        """:class:`UnknownDefinition` unless ``definition`` is registered or has sagas counted."""
        known = {*self.catalogue.names(), *(c.definition for c in counts)}
        if definition is not None and definition not in known:
            raise UnknownDefinition(f"no definition named {definition!r} (known: {', '.join(sorted(known))})")


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


def _total(counts: Sequence[SagaCount], query: Query) -> int:
    return sum(c.count for c in counts if query.accepts_count(c.definition, c.version, c.status))


def _json_output(shape: Shape, step_name: str, output: object) -> msgspec.Raw:
    """The output as JSON, for a step of ``shape``'s definition (:class:`InvalidInput` if not)."""
    try:
        shape.step_named(step_name)
    except KeyError:
        names = ", ".join(s.name for s in shape.steps)
        raise InvalidInput(f"unknown step {step_name!r} in {shape.key} (steps: {names})") from None
    if not isinstance(output, bytes | str):
        return msgspec.Raw(_json.encode(output))
    raw = output.encode() if isinstance(output, str) else output
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError as error:
        raise InvalidInput(f"the output is not valid JSON: {error}") from error
    return msgspec.Raw(raw)


def _typed_output(
    definition: Saga[Any] | None, shape: Shape, state: SagaState, step_name: str, raw: msgspec.Raw
) -> bytes:
    """The output as canonical JSON, checked against the step's output type.

    With the code, decoded as the type; without it, checked against the type's registered
    JSON schema. A failed compensation takes any JSON. :class:`InvalidInput` says what is
    wrong, before anything is sent.
    """
    shaped = shape.step_named(step_name)
    record = state.branches.get(step_name) if "#" in step_name else state.steps.get(shaped.name)
    if record is not None and record.status in (StepStatus.COMPENSATION_FAILED, StepStatus.CONFIRM_FAILED):
        return _json.encode(msgspec.json.decode(raw))
    if shaped.output is None:
        if msgspec.json.decode(raw) is not None:
            raise InvalidInput(f"{shape.key}.{shaped.name} has no output: give null")
        return b"null"
    if definition is None:
        try:
            return _json.encode(shaped.output.check(msgspec.json.decode(raw)))
        except ValueError as error:
            raise InvalidInput(
                f"the output is not a valid {shaped.output.name} for {shape.key}.{shaped.name}: {error}"
            ) from error
    step = definition.step_named(step_name)
    assert step.output_type is not None  # noqa: S101 - the shape of this very definition has one
    try:
        typed = msgspec.json.decode(raw, type=step.output_type)
    except msgspec.ValidationError as error:
        name = getattr(step.output_type, "__name__", str(step.output_type))
        raise InvalidInput(
            f"the output is not a valid {name} for {definition.key}.{step.name}: {error}"
        ) from error
    return _json.encode(typed)
