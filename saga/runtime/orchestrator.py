"""The orchestrator of one context: turns inbox entries into committed decisions.

For every inbox entry: decode the event, load the saga (from a revision-checked cache or
Redis), decide, and commit the decision with the transition script, which also
acknowledges the entry. The entries of one read are handled together on one task (a batch
handler of the bus): their loads share one pipelined round trip, and so do their commits.
A commit that loses a race (another worker moved the saga) is
re-decided on fresh state; one whose lease was taken over is dropped (the new holder decides
it). Replies and signals that do not match their step's declared output type, entries for
unknown sagas and malformed entries are dead-lettered by the bus with the reason.

It also installs the handlers of the partitions' other streams, each in a module of its
own: local actions (``cmd:_local``, ``saga/runtime/local_actions.py``); the context's index of
event waits (``cmd:_waits`` and every stream an event wait names,
``saga/runtime/event_routing.py``); and child sagas (``cmd:_child``,
``saga/runtime/children.py``), whose end reports (``ParentReport`` inbox entries) it forwards
to their parents.

A client's start request is decided by ``saga/runtime/start_requests.py`` (its checks, and
the refusal kept for the client), committed with the other decisions of its batch.

Entries of one saga are decided one at a time in this process (a lock per saga id,
``saga/runtime/saga_locks.py``, and one entry per saga in each round of a batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bus import Bus, Clock, Delivery, Envelope, LeaseLost, PermanentError, Publisher, TransientError
from bus.lowlevel import (
    AFTER_COMMIT_BEFORE_ACK,
    BEFORE_COMMIT,
    CommandCall,
    ScriptCall,
    crash_point,
    get_logger,
)
from saga.core.child_messages import CHILD
from saga.core.commands import LocalCall
from saga.core.decider import Decision, decide
from saga.core.model import SagaState, SignalReceived, TimerFired
from saga.core.tokens import Signer, check_wait
from saga.definition.registry import Registry
from saga.definition.saga import LOCAL, Context
from saga.definition.waits import WAITS
from saga.errors import InvalidInput, InvalidToken, KeyBusy, SagaExists, UnknownDefinition
from saga.runtime.children import Children
from saga.runtime.config import EngineConfig
from saga.runtime.event_routing import EventRouter
from saga.runtime.flow_gates import Commit, FlowGates, Item
from saga.runtime.local_actions import LocalActions
from saga.runtime.payload_checks import accepted
from saga.runtime.protocol import START, signal_token, to_event
from saga.runtime.saga_cache import SagaCache
from saga.runtime.saga_locks import SagaLocks
from saga.runtime.signal_checks import check_task_path
from saga.runtime.start_requests import StartPlanner, refuse_start
from saga.runtime.start_verdict import Refusal, RefusalKind
from saga.runtime.tracing import transition_span
from saga.store.branches import load_saga, timer_pending
from saga.store.codec import Loaded
from saga.store.commit import PARENT_REPORT, commit_call, commit_result, stamps_of
from saga.store.keys import Partition, check_saga_id
from saga.store.token_keys import load_signer, publish_verifier
from saga.store.trust import Seal, authorize, check_fresh, credited, orchestrator_of

GROUP = "orchestrator"
_log = get_logger("redsaga.saga")


class Orchestrator:
    """Drives the sagas of one context: its inbox consumer and its local-action consumer.

    ``observers`` are called with the new state after every committed transition (metrics,
    benchmarks, tests); they must be quick and must not raise.
    """

    def __init__(
        self,
        redis: Any,
        registry: Registry,
        context: Context,
        *,
        clock: Clock,
        config: EngineConfig,
        cache: SagaCache | None = None,
    ) -> None:
        self.redis = redis
        self.registry = registry
        self.context = context
        self.clock = clock
        self.config = config
        self.principal = orchestrator_of(context.name)
        """Who this orchestrator signs as, and what its inbox entries must be signed for."""
        self.observers: list[Callable[[SagaState], None]] = []
        self.transitions: list[Callable[[SagaState | None, Decision], None]] = []
        """Called with the saga as it was (``None`` for a start) and the decision, after every
        committed transition (metrics: ``saga/metrics``); quick, and must not raise."""
        self.cache = SagaCache(config.cache_size) if cache is None else cache
        """The sagas as this process last wrote them (shared with the worker's clients)."""
        self._signer: Signer | None = None
        self._seal = Seal(config.auth, self.principal)
        self._publisher = Publisher(
            redis, source=context.name, config=config.bus, auth=config.auth, principal=self.principal
        )
        definitions = [d for d in registry if d.context.name == context.name]
        self.local_actions = LocalActions(registry, self.signer)
        """The handler of the partitions' ``cmd:_local`` streams."""
        self.events = EventRouter(
            redis,
            context.name,
            definitions,
            clock=clock,
            config=config,
            publisher=self._publisher,
            audience=self.principal,
        )
        """The handler of event-wait registrations and of the events the sagas wait for."""
        self._children = Children(
            redis, registry, clock=clock, config=config, source=context.name, cache=self.cache
        )
        self._has_children = any(
            s.child is not None for d in definitions for s in [*d.steps, *d.branch_steps()]
        )
        self._locks = SagaLocks()
        self._by_tag = {partition.tag: partition for partition in self.partitions}
        self._starts = StartPlanner(registry, context.name, config=config, transition=self._transition)
        self.gates = FlowGates(redis, registry, clock, self._publisher)
        """Concurrency keys' slots and rate limits' tokens (``saga/runtime/flow_gates.py``)."""

    async def signer(self) -> Signer:
        """The context's resume-token signer (loaded once).

        With signing on, loading it publishes the context's public token keys, so that
        clients can check tokens before they send them.
        """
        if self._signer is None:
            signer = await load_signer(
                self.redis,
                self.context.name,
                auth=self.config.auth,
                secret=self.config.signal_secret,
                ttl_ms=self.config.token_ttl_s * 1000,
            )
            if self.config.auth.enabled:
                await publish_verifier(self.redis, signer)
            self._signer = signer
        return self._signer

    @property
    def partitions(self) -> list[Partition]:
        """Every partition of the context this worker serves (``EngineConfig.partitions``)."""
        indexes = filter(self.config.serves, range(self.context.partitions))
        return [Partition(self.context.name, i) for i in indexes]

    def install(self, bus: Bus) -> None:
        """Register the inbox and local-action consumers of every partition on ``bus``."""
        me, only_me = self.principal, [self.principal]
        for partition in self.partitions:
            inbox = bus.handler(
                partition.inbox,
                None,
                group=GROUP,
                idempotent=False,
                batch=True,
                principal=me,
                bounded_letters=True,  # every principal writes it: a flood is bounded, not stored
            )
            inbox(self.on_inbox_batch)
            local = bus.handler(
                partition.commands(LOCAL), LocalCall, group=LOCAL, principal=me, senders=only_me
            )
            local(self.local_actions.run)
            if self.events.streams:
                waiting = bus.handler(
                    partition.commands(WAITS),
                    None,
                    group=WAITS,
                    idempotent=False,
                    principal=me,
                    senders=only_me,
                )
                waiting(self.events.on_waits)
            if self._has_children:
                children = bus.handler(
                    partition.commands(CHILD),
                    None,
                    group=CHILD,
                    idempotent=False,
                    principal=me,
                    senders=only_me,
                )
                children(self._children.on_command)
        for stream in self.events.streams:
            group = f"{self.context.name}.waits"
            bus.subscribe(stream, group=group, idempotent=False, principal=me)(self.events.on_event)

    async def on_inbox(self, envelope: Envelope, delivery: Delivery) -> None:
        """Decide and commit one inbox entry (the commit acknowledges it)."""
        [outcome] = await self.on_inbox_batch([(envelope, delivery)])
        if outcome is not None:
            raise outcome

    async def on_inbox_batch(self, batch: list[tuple[Envelope, Delivery]]) -> list[BaseException | None]:
        """Decide and commit the inbox entries of one read; return each entry's outcome.

        The entries of one read are decided together on one task and their transitions
        sent in one pipelined batch (the bus's batch handler: ``bus.Bus.handler``), which
        spares a task hand-off and a wait per entry. Entries of one saga are decided in
        arrival order, one per round (see the module docstring).
        """
        outcomes: list[BaseException | None] = [None] * len(batch)
        waiting: list[int] = []
        for index, (envelope, _) in enumerate(batch):
            try:
                check_saga_id(envelope.correlation_id)
            except InvalidInput as error:
                outcomes[index] = PermanentError(str(error))
                continue
            if envelope.type != PARENT_REPORT:
                waiting.append(index)
                continue
            try:  # a child saga of this context ended
                await self._children.forward(envelope)
            except Exception as error:  # noqa: BLE001 - the bus classifies each entry's failure
                outcomes[index] = error
        while waiting:
            this_round: list[int] = []
            later: list[int] = []
            seen: set[str] = set()
            for index in waiting:
                saga_id = batch[index][0].correlation_id
                (later if saga_id in seen else this_round).append(index)
                seen.add(saga_id)
            await self._decide_round([(i, *batch[i]) for i in this_round], outcomes)
            waiting = later
        return outcomes

    async def _decide_round(self, items: list[Item], outcomes: list[BaseException | None]) -> None:
        """Decide and commit entries of distinct sagas; re-decide those that lost a race."""
        async with self._locks.holding(sorted(envelope.correlation_id for _, envelope, _ in items)):
            for _ in range(self.config.max_conflicts):
                items = await self._decide_once(items, outcomes)
                if not items:
                    return
        for index, envelope, _ in items:
            outcomes[index] = TransientError(
                f"saga {envelope.correlation_id}: {self.config.max_conflicts} concurrent updates in a row"
            )

    async def _decide_once(self, items: list[Item], outcomes: list[BaseException | None]) -> list[Item]:
        """One pass: load, decide, commit all of ``items``; return those that lost a race."""
        start_ns = time.time_ns()  # the transitions' spans: the items are decided together
        commits, calls = await self._plan_round(items, await self._load_all(items), outcomes)
        verdicts = None
        if self.gates.active and commits:
            verdicts = await self.gates.before_commit(commits, calls, outcomes, self._refuse)
            if verdicts is None:
                return []
        results = await items[0][2].call_many(calls) if calls else []
        again: list[Item] = []
        committed: list[tuple[SagaState | None, Decision]] = []
        for (item, decision, after, before), raw in zip(commits, results, strict=True):
            index, envelope, delivery = item
            if isinstance(raw, BaseException):
                outcomes[index] = raw
                continue
            result = commit_result(raw)
            if result.outcome == "ok":
                crash_point(AFTER_COMMIT_BEFORE_ACK)
                self._committed(envelope, delivery, decision, after, result.revision, before=before)
                transition_span(envelope, before, decision, start_ns)
                committed.append((before, decision))
                continue
            self.cache.forget(self.context.name, envelope.correlation_id)
            if result.outcome == "lost":
                outcomes[index] = _taken_over(delivery)
            elif result.outcome == "drained":
                drained = f"{decision.state.name}@{decision.state.version}"
                refused = InvalidInput(f"{drained} is drained (new sagas may not start on it)")
                outcomes[index] = await self._refuse(item, refused, "drained")
            else:
                _log.debug("concurrent update; deciding again", saga_id=envelope.correlation_id)
                again.append(item)
        if self.gates.active:
            await self.gates.after_commit(verdicts, committed)
        return again

    async def _plan_round(
        self,
        items: list[Item],
        loads: list[Loaded | BaseException | None],
        outcomes: list[BaseException | None],
    ) -> tuple[list[Commit], list[ScriptCall]]:
        """Decide each item: the commits to make and their transition calls (refusals in ``outcomes``)."""
        commits: list[Commit] = []
        calls: list[ScriptCall] = []
        for item, loaded in zip(items, loads, strict=True):
            index, envelope, delivery = item
            try:
                planned = await self._plan(envelope, delivery, loaded)
            except (SagaExists, InvalidInput) as refused:
                outcomes[index] = await self._refuse(item, refused)
                continue
            except Exception as error:  # noqa: BLE001 - the bus classifies each entry's failure
                outcomes[index] = error
                continue
            if planned is None:  # a repeated start request: acknowledged, nothing to do
                continue
            decision, call, after = planned
            crash_point(BEFORE_COMMIT)
            commits.append((item, decision, after, loaded.state if isinstance(loaded, Loaded) else None))
            calls.append(call)
        return commits, calls

    async def _refuse(
        self, item: Item, error: BaseException, kind: RefusalKind | None = None
    ) -> BaseException:
        """The outcome of an entry refused with ``error``: a start's refusal is recorded for its client."""
        _, envelope, delivery = item
        if envelope.type != START:
            return error
        if kind is None:
            kind = (
                "exists"
                if isinstance(error, SagaExists)
                else "busy"
                if isinstance(error, KeyBusy)
                else "invalid"
            )
        refusal = Refusal(kind, str(error))
        return await refuse_start(self.redis, self._by_tag[delivery.stream.tag], refusal, envelope)

    async def _load_all(self, items: list[Item]) -> list[Loaded | BaseException | None]:
        """Each item's saga: cached, else read in one pipelined batch (errors as values).

        A start request is always decided on what Redis holds: a saga this process remembers
        may have vanished since (a lost AOF tail), and a start is how an operator restores it.
        """
        context, cache = self.context.name, self.cache
        loads: list[Loaded | BaseException | None]
        loads = [None if e.type == START else cache.get(context, e.correlation_id) for _, e, _ in items]
        missing = [i for i, loaded in enumerate(loads) if loaded is None]
        if not missing:
            return loads
        reads = [
            CommandCall(("HGETALL", self._by_tag[items[i][2].stream.tag].saga(items[i][1].correlation_id)))
            for i in missing
        ]
        raws = await items[0][2].call_many(reads, retry=False)
        for i, raw in zip(missing, raws, strict=True):
            _, envelope, delivery = items[i]
            if isinstance(raw, BaseException):
                loads[i] = raw
                continue
            try:
                partition = self._by_tag[delivery.stream.tag]
                loads[i] = await load_saga(self.redis, partition, envelope.correlation_id, raw)
            except Exception as error:  # noqa: BLE001 - that entry fails, not the batch
                loads[i] = error
        return loads

    async def _plan(
        self, envelope: Envelope, delivery: Delivery, loaded: Loaded | BaseException | None
    ) -> tuple[Decision, ScriptCall, Loaded] | None:
        """Decide an entry for its saga; the transition call and the saga as it will be.

        ``None`` for a start request of a saga that exists already with the same data.
        """
        if isinstance(loaded, BaseException):  # the saga could not be read
            raise loaded
        if delivery.scope.cancel_called:  # the lease was lost: the new holder decides
            raise _taken_over(delivery)
        saga_id = envelope.correlation_id
        partition = self._by_tag[delivery.stream.tag]
        if envelope.type == START:
            return self._starts.plan(envelope, delivery, partition, loaded, await self.signer())
        if loaded is None:
            raise PermanentError(f"no saga {saga_id!r} in {partition.tag} (unknown saga id)")
        event = to_event(envelope)
        try:
            definition = self.registry.get(loaded.state.name, loaded.state.version)
        except UnknownDefinition as error:
            raise TransientError(f"{error}; a worker serving it must take this entry") from error
        authorize(
            self.config.auth,
            self.context.name,
            definition,
            loaded.state,
            event,
            envelope,
            delivery.principal,
            self.registry.lineage,
        )
        pending = isinstance(event, TimerFired) and await timer_pending(self.redis, partition, event.timer_id)
        check_fresh(loaded.state, event, envelope, stamps_of(envelope), pending=pending)
        event = credited(event, delivery.principal)
        if isinstance(event, SignalReceived):
            await self._check_token(envelope, event, loaded.state)
            await check_task_path(self.redis, loaded.state, event.step, event.n, envelope)
        event = accepted(definition, event, envelope)
        signer = await self.signer() if definition.takes_signals else None
        decision = decide(definition, loaded.state, event, signer=signer)
        return decision, *self._transition(partition, loaded, decision, event, delivery)

    def _transition(
        self, partition: Partition, loaded: Loaded | None, decision: Decision, event: Any, delivery: Delivery
    ) -> tuple[ScriptCall, Loaded]:
        """The transition call committing ``decision`` for ``event``, and the saga as it will be."""
        built = commit_call(
            partition,
            loaded,
            decision,
            event,
            delivery=delivery,
            now_ms=self.clock.now_ms(),
            timer_now_ms=self.clock.script_now_ms(),
            retention_s=self.config.retention_s,
            seal=self._seal,
        )
        if self.gates.active:  # kept only once built: a call that failed to build is no commit
            self.gates.remember(
                decision, lambda held: self._transition(partition, loaded, held, event, delivery)
            )
        return built

    async def _check_token(self, envelope: Envelope, event: SignalReceived, state: SagaState) -> None:
        """Refuse a signal whose resume token this context did not make for this very wait."""
        try:
            ref = (await self.signer()).verify(signal_token(envelope), now_ms=self.clock.now_ms())
            check_wait(
                ref,
                context=state.context,
                partition=state.partition,
                saga_id=state.id,
                incarnation=state.created_ms,
                wait=(event.step, event.n),
            )
        except InvalidToken as error:
            raise PermanentError(f"signal refused: {error}") from error

    def _committed(
        self,
        envelope: Envelope,
        delivery: Delivery,
        decision: Decision,
        after: Loaded,
        revision: int,
        *,
        before: SagaState | None,
    ) -> None:
        decision.state.revision = revision
        self.cache.keep(after)
        delivery.mark_acked()
        for observer in self.observers:
            observer(decision.state)
        for hook in self.transitions:
            hook(before, decision)
        if decision.ignored:
            _log.info(
                "event recorded and ignored",
                saga_id=envelope.correlation_id,
                type=envelope.type,
                reason=decision.ignored,
            )
        else:
            _log.debug(
                "transition committed",
                saga_id=envelope.correlation_id,
                status=decision.state.status,
                revision=revision,
            )


def _taken_over(delivery: Delivery) -> LeaseLost:
    return LeaseLost(f"inbox entry {delivery.entry_id} was taken over before the commit")
