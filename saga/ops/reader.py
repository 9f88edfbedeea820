"""The read side of the admin client: see what sagas do, changing nothing.

:class:`SagaReader` gets, inspects, lists, counts, exports and replays sagas, reads their
dead letters and gathers stats; :class:`~saga.ops.admin.SagaAdmin` is a reader that also
acts (start, cancel, retry, force-complete, redrive, requeue and purge dead letters). The
web UI and ``saga inspect``, ``list``, ``replay``, ``export``, ``dlq list`` and ``stats``
use only what is here.

A saga's state, history and branch records are read together in one ``MULTI``, from
whichever context holds it. The definitions come from the code, or from the shapes workers
registered in Redis (a :class:`~saga.versions.catalogue.Catalogue`); replay needs the code
and raises :class:`~saga.errors.CodeRequired` without it.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from typing import Any

from bus import Clock, DeadLetter, LetterFilter, Stream, SystemClock, dead_letters
from bus.lowlevel import RideThrough, redis_errors, rides_through
from saga.core.history_entry import HistoryEntry
from saga.core.model import SagaState
from saga.core.replay import ReplayReport, replay_history
from saga.core.states import SagaStatus
from saga.core.task_rules import TaskLog
from saga.core.timer_ids import attempt_of_timer
from saga.core.tokens import Signer
from saga.definition.registry import Registry
from saga.definition.saga import LOCAL, Context, Saga
from saga.errors import CodeRequired, InvalidInput, SagaError, SagaNotFound, UnknownDefinition
from saga.ops.graph import Format as GraphFormat
from saga.ops.graph import path_graph
from saga.ops.inspect import Inspection, TimerView, build_inspection
from saga.ops.letters import LetterPage
from saga.ops.listing import Query, SagaPage, list_sagas, matching_rows
from saga.ops.outside_waits import explain_outside_waits
from saga.ops.stats import SagaCount, SagaTally, Stats, gather, saga_counts
from saga.ops.trace import Trace
from saga.runtime.app import App
from saga.runtime.client import SagaClient
from saga.runtime.config import EngineConfig
from saga.store.branches import decode_branches, read_together
from saga.store.codec import decode_state
from saga.store.history import read_history
from saga.store.keys import Partition, PartitionKeys, partition_of
from saga.store.tasks import RedisTaskStore
from saga.versions.catalogue import Catalogue

_STAND_IN_KEY = b"redsaga: predicting commands, never sent"


class SagaReader:
    """Inspect, list, count, replay and export the sagas of an app's definitions.

    ``definitions`` is the :class:`App` (its participants tell :meth:`stats` which command
    streams to read), a :class:`Registry`, or a :class:`Catalogue` (the definitions as
    Redis knows them, no code). ``participants`` adds command streams to :meth:`stats` in
    every context. Nothing here writes to Redis.
    """

    def __init__(
        self,
        redis: Any,
        definitions: App | Registry | Catalogue,
        *,
        clock: Clock | None = None,
        config: EngineConfig | None = None,
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
        self._extra_participants = list(participants)
        self.principal = self.config.auth.signer_for("operator", "orchestrator")
        """How the operator signs what it sends (``None`` with signing off)."""
        self.ride_through = RideThrough(self.clock, self.config.unavailable_deadline_s)
        """What retries the reads here while Redis is unavailable (a failover, a restart)."""
        self.client = SagaClient(
            redis,
            self.registry or Registry([]),
            clock=self.clock,
            config=self.config,
            source="admin",
            principal=self.principal,
        )

    # -- sagas ---------------------------------------------------------------------------------

    @rides_through
    async def get(self, saga_id: str, *, context: str | None = None) -> SagaState:
        """The saga's current state (:class:`SagaNotFound` if no context holds it)."""
        return (await self._read(saga_id, context))[1]

    @rides_through
    async def history(self, saga_id: str, *, context: str | None = None) -> list[HistoryEntry]:
        """Every history entry of the saga, oldest first."""
        return (await self._read(saga_id, context))[2]

    @rides_through
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
            task_log=await self._task_log(partition, saga_id),
        )
        found.graph = diagram
        await explain_outside_waits(self.redis, partition, state, found, now)
        return found

    @rides_through
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
        moved_after_ms: int | None = None,
        moved_before_ms: int | None = None,
        newest_first: bool = False,
        id_contains: str = "",
    ) -> SagaPage:
        """A page of sagas by status, definition and version; or those stuck for a while.

        With ``stuck_for_ms``, only sagas that have not moved for that long are listed,
        stalest first (from the ``active`` index), leaving out those waiting within their
        wait's deadline (counted in ``waiting``); otherwise oldest in their status first
        (``newest_first``: most recently moved first). ``moved_after_ms`` and
        ``moved_before_ms`` bound when they last moved (an ended saga: when it ended);
        ``id_contains`` keeps sagas whose id holds that text (a walk of the indexes read).
        ``total`` counts every page. An unknown ``definition`` raises
        :class:`UnknownDefinition`.
        """
        if limit < 1 or offset < 0:
            raise InvalidInput("limit must be positive and offset not negative")
        query, partitions, counts = await self._counted(
            status,
            definition,
            version,
            context,
            stuck_for_ms,
            moved_after_ms=moved_after_ms,
            moved_before_ms=moved_before_ms,
            newest_first=newest_first,
            id_contains=id_contains,
        )
        total = sum(c.count for c in query.matching(counts)) if query.counted else None
        return await list_sagas(
            self.redis, partitions, query, now_ms=await self.now_ms(), offset=offset, limit=limit, total=total
        )

    @rides_through
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
        query, partitions, counts = await self._counted(status, definition, version, context, stuck_for_ms)
        if stuck_for_ms is None:
            kept = query.matching(counts)
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

    @rides_through
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

    @rides_through
    async def counts(self, *, context: str | None = None) -> builtins.list[SagaCount]:
        """Sagas per definition, version and status (from the counters)."""
        return await saga_counts(self.redis, self._partitions(context))

    @rides_through
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
            tasks=await self._task_log(partition, saga_id),
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

    @rides_through
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

    # -- dead letters --------------------------------------------------------------------------

    def dead_letter_streams(
        self, *, context: str | None = None, tags: Sequence[str] = ()
    ) -> builtins.list[str]:
        """The dead-letter streams of the context's partitions (or of the given hash tags)."""
        if tags:
            return [PartitionKeys(tag).dead_letters for tag in tags]
        return [p.dead_letters for p in self._partitions(context)]

    @rides_through
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

    async def dead_letter_page(
        self,
        where: LetterFilter | None = None,
        *,
        context: str | None = None,
        tags: Sequence[str] = (),
        limit: int = 100,
        offset: int = 0,
    ) -> LetterPage:
        """One page of the letters matching ``where``: ``limit`` of them from ``offset``.

        ``next_offset`` says whether more letters match (``None``: this is the last page).
        """
        found = await self.dead_letters(where, context=context, tags=tags, limit=offset + limit + 1)
        return LetterPage.of(found, offset=offset, limit=limit)

    @rides_through
    async def dead_letter(
        self, letter_id: str, *, context: str | None = None, tags: Sequence[str] = ()
    ) -> DeadLetter:
        """One letter by id (``KeyError`` naming it when no dead-letter stream holds it)."""
        found = await self.dead_letters(LetterFilter(ids=(letter_id,)), context=context, tags=tags)
        if not found:
            raise KeyError(f"no dead letter {letter_id!r}")
        return found[0]

    # -- helpers -------------------------------------------------------------------------------

    async def now_ms(self) -> int:
        """Now, by the clock the engine's indexes use (Redis ``TIME`` unless a test clock is set)."""
        scripted = self.clock.script_now_ms()
        if scripted >= 0:
            return scripted
        with redis_errors():
            seconds, micros = await self.redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

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
        """State and history of the saga, read together (one revision), from whichever context holds it."""
        for ctx in self._contexts(context):
            partition = Partition(ctx.name, partition_of(saga_id, ctx.partitions))
            raw, history, branches = await read_together(
                self.redis,
                partition.saga(saga_id),
                [("LRANGE", partition.history(saga_id), "0", "-1"), ("HGETALL", partition.branches(saga_id))],
            )
            if raw:
                state = decode_state(saga_id, raw, context=partition.context, partition=partition.index).state
                state.branches = decode_branches(saga_id, branches)
                return partition, state, read_history(history, state)
        raise SagaNotFound(saga_id)

    async def _task_log(self, partition: Partition, saga_id: str) -> builtins.list[TaskLog]:
        """The saga's task actions, kept beside its history (``docs/human-tasks.md``)."""
        return await RedisTaskStore(self.redis).log(partition, saga_id)

    async def _timers(self, partition: Partition, state: SagaState, now_ms: int) -> builtins.list[TimerView]:
        """The saga's pending attempt timers, from their ids and due times.

        Their signed firings are kept from the operator (``saga/store/keys/``).
        """
        ids = [s.timer for s in [*state.steps.values(), *state.branches.values()] if s.timer]
        with redis_errors():
            due = await self.redis.zmscore(partition.timers, ids) if ids else []
        views = []
        for timer_id, score in zip(ids, due, strict=True):
            parsed = attempt_of_timer(state.id, timer_id)
            if score is None or parsed is None:
                continue  # fired already: the event is in the inbox
            step, kind, attempt, purpose = parsed
            views.append(
                TimerView(
                    timer_id=timer_id,
                    purpose=purpose,
                    step=step,
                    kind=kind,
                    attempt=attempt,
                    due_ms=int(score),
                    due_in_ms=int(score) - now_ms,
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

    async def _counted(
        self,
        status: str | SagaStatus | Sequence[str | SagaStatus],
        definition: str | None,
        version: int | None,
        context: str | None,
        stuck_for_ms: int | None,
        **narrower: Any,
    ) -> tuple[Query, builtins.list[Partition], builtins.list[SagaCount]]:
        """The query, its partitions and their counters, an unknown ``definition`` refused.

        ``narrower``: :meth:`Query.parse`'s keyword filters (time range, order, id text).
        """
        query = Query.parse(status, definition, version, stuck_for_ms, **narrower)
        partitions = self._partitions(context)
        counts = await saga_counts(self.redis, partitions)
        self._check_named(definition, counts)
        return query, partitions, counts

    def _check_named(self, definition: str | None, counts: Sequence[SagaCount]) -> None:
        """:class:`UnknownDefinition` unless ``definition`` is registered or has sagas counted."""
        known = {*self.catalogue.names(), *(c.definition for c in counts)}
        if definition is not None and definition not in known:
            raise UnknownDefinition(f"no definition named {definition!r} (known: {', '.join(sorted(known))})")
