"""The client: start sagas, read and query them, signal them, cancel them, list them.

Waiting for a saga's end (``wait``, ``result``) is ``saga/runtime/results.py``'s.
Starting is one script call that creates the saga and dispatches its first step; it is
idempotent by saga id (give an id derived from a business key, and a second start returns
the existing saga). Reads and queries disturb nothing. Cancel and signals go through the
saga's inbox, so they are decided in order with the replies racing them.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bus import Clock, Envelope, PayloadTooLarge, Publisher, SystemClock, uuid7
from bus.lowlevel import Batcher, RideThrough, acks_of, redis_errors, rides_through
from bus.tracing import trace_headers
from saga.core.decider import start as decide_start
from saga.core.model import ParentLink, SagaState, Started
from saga.core.query import SagaQuery, describe, timer_ids
from saga.core.states import SagaStatus
from saga.core.tokens import Signer, TokenVerifier, check_wait, peek
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.definition.shape import Shape
from saga.errors import (
    InvalidInput,
    SagaNotFound,
    UnknownDefinition,
)
from saga.runtime.config import EngineConfig
from saga.runtime.protocol import CANCEL, SIGNAL, START, OperatorRequest, SignalDelivery, StartRequest
from saga.runtime.rate_gate import RateGate
from saga.runtime.results import SagaResults
from saga.runtime.saga_cache import SagaCache
from saga.runtime.signal_checks import check_wait_open, refuse_task_wait
from saga.runtime.slot_gate import SlotGate
from saga.runtime.start_verdict import check_existing, drained_error, request_start
from saga.runtime.tracing import keep_trace, signal_span, start_span
from saga.store.branches import load_saga
from saga.store.commit import commit_call, commit_result
from saga.store.keys import Partition, check_saga_id, partition_of
from saga.store.token_keys import load_signer, load_verifier
from saga.store.trust import Seal, inbox_audience, orchestrator_of
from saga.versions.registry import Versions

_json = msgspec.json.Encoder()


class SagaClient(SagaResults):
    """Starts and reads the sagas of the definitions in ``registry``; waits for their ends.

    Raises :class:`bus.AuthError` when ``config.auth`` holds no keyring and signing was not
    turned off on purpose (``REDSAGA_VERIFY=off``; :meth:`~saga.EngineConfig.check_signing`).

    ``cache``, a worker's :class:`~saga.runtime.saga_cache.SagaCache`, keeps every saga this
    client starts as written, so the worker in the same process decides its first reply
    without reading it back (:meth:`saga.SagaWorker.client` makes such a client).
    """

    def __init__(
        self,
        redis: Any,
        registry: Registry,
        *,
        clock: Clock | None = None,
        config: EngineConfig | None = None,
        source: str = "client",
        principal: str | None = None,
        cache: SagaCache | None = None,
    ) -> None:
        self.redis = redis
        self.registry = registry
        self.clock = clock or SystemClock()
        self.config = config or EngineConfig()
        self.source = source
        self.config.check_signing(f"the SagaClient {source!r}", redis, warn=False)
        auth = self.config.auth
        self.principal = (
            auth.signer_for("client", "operator", "orchestrator") if principal is None else principal
        )
        """Who this client signs its signals and cancel requests as (``""``: signing off)."""
        self._publisher = Publisher(
            redis, source=source, config=self.config.bus, auth=auth, principal=self.principal
        )
        self._signers: dict[str, Signer] = {}
        self._verifiers: dict[str, TokenVerifier] = {}
        self._shapes: dict[tuple[str, str, int], Shape | None] = {}
        self._batcher = Batcher(redis, acks=acks_of(self.config.bus))
        self._cache = cache
        self._rates = RateGate(redis, registry.limits, self.clock)
        self._slots = SlotGate(redis, registry, self.clock, None, self._batcher)
        self.ride_through = RideThrough(self.clock, self.config.unavailable_deadline_s)
        """What retries this client's calls while Redis is unavailable (a failover, a restart)."""

    async def signer(self, context: str) -> Signer:
        """The resume-token signer of ``context`` (loaded once).

        :class:`SagaError` unless this process may make tokens (with signing on, only the
        context's orchestrator may).
        """
        if context not in self._signers:
            self._signers[context] = await load_signer(
                self.redis,
                context,
                auth=self.config.auth,
                secret=self.config.signal_secret,
                ttl_ms=self.config.token_ttl_s * 1000,
            )
        return self._signers[context]

    def can_make_tokens(self, context: str) -> bool:
        """Whether this process may make ``context``'s resume tokens.

        It may with signing off, or when it holds the context's orchestrator keyring.
        """
        return self.orchestrates(context)

    @rides_through
    async def verifier(self, context: str) -> TokenVerifier:
        """What checks ``context``'s tokens here.

        Its signer if this process has one, else the public keys its orchestrator published.
        """
        if context not in self._verifiers:
            if self.can_make_tokens(context):
                self._verifiers[context] = await self.signer(context)
            else:
                self._verifiers[context] = await load_verifier(self.redis, context)
        return self._verifiers[context]

    async def start(
        self,
        definition: Saga[Any] | str,
        data: object,
        *,
        version: int | None = None,
        saga_id: str | None = None,
        by: str = "",
        parent: ParentLink | None = None,
        trace: tuple[str, str] | None = None,
        wait_s: float = 10.0,
    ) -> str:
        """Start a saga with ``data``; return its id once the saga exists.

        ``definition`` is a definition, or a saga name: then the newest version in this
        client's registry is started, or ``version`` when given. The saga runs to its end on
        the version it started on. Invalid data raises :class:`InvalidInput` and stores
        nothing; data encoded larger than ``BusConfig.max_payload_bytes`` raises
        :class:`bus.PayloadTooLarge` and stores nothing; a drained version raises
        :class:`VersionDrained` and stores nothing. With
        ``saga_id`` the call is idempotent: if that saga exists already with equal data its
        id is returned; :class:`StartConflict` is raised if it has other data (the new data
        is not stored), :class:`SagaExists` if it runs another definition. ``parent`` makes it
        a child saga that reports its end to that parent step (``saga/runtime/children.py``).

        With signing on, a client that does not hold the context's orchestrator keyring
        cannot write a saga itself: it puts a start request on the saga's inbox, signed as
        itself, and waits up to ``wait_s`` seconds for the orchestrator's verdict
        (``saga/runtime/start_verdict.py``): the saga, or the refusal, raised as above
        (:class:`StartConflict`, :class:`SagaExists`, :class:`VersionDrained`, or
        :class:`InvalidInput` for data it refuses); the refused request is dead-lettered with
        the reason. No verdict in time raises the retryable :class:`StartPending` (the
        request stays queued). ``wait_s=0`` returns once the request is stored. An id that
        exists already is judged at once (nothing is sent); each request has an id of its own,
        so a saga lost with its request (a lost AOF tail) starts again on a repeat.

        With tracing on, the start is a span (``saga start <name>``, child of the current
        span) whose trace the saga keeps for everything it sends (``saga/runtime/tracing.py``);
        ``trace``, a W3C ``(traceparent, tracestate)``, is the context kept when this process
        does not trace (a child saga passes its parent's on).
        """
        saga_id = check_saga_id(uuid7() if saga_id is None else saga_id)
        definition = self._definition(definition, version)
        encoded = definition.encode_data(data)
        if len(encoded) > self.config.bus.max_payload_bytes:
            raise PayloadTooLarge(len(encoded), self.config.bus.max_payload_bytes)
        partition = self._partition(definition.context.name, saga_id)
        now = self.clock.now_ms()
        event = Started(
            id=uuid7(),
            at_ms=now,
            data=msgspec.Raw(encoded),
            by=by or self.source,
            saga=definition.key,
            steps=[s.name for s in definition.steps],
            parent=parent,
        )
        with start_span(definition, saga_id, partition.inbox.key, trace) as kept:
            return await self._start(
                definition, saga_id, encoded, partition, event, trace=kept, wait_s=wait_s
            )

    @rides_through
    async def _start(
        self,
        definition: Saga[Any],
        saga_id: str,
        encoded: bytes,
        partition: Partition,
        event: Started,
        *,
        trace: tuple[str, str],
        wait_s: float,
    ) -> str:
        """Write the saga (or, without its orchestrator's keyring, ask its orchestrator to)."""
        now = event.at_ms
        if not self.orchestrates(definition.context.name):
            request = StartRequest(saga=event.saga, data=event.data, by=event.by, parent=event.parent)
            envelope = Envelope(
                # its own id: the verdict awaited is this request's (an earlier one's may be stale)
                id=uuid7(),
                type=START,
                payload=_json.encode(request),
                source=self.source,
                correlation_id=saga_id,
                created_at_ms=now,
                headers=trace_headers(*trace),
            )
            return await request_start(
                self.redis,
                self._publisher,
                definition,
                envelope,
                partition=partition,
                encoded=encoded,
                wait_s=wait_s,
            )
        signer = await self.signer(definition.context.name) if definition.takes_signals else None
        decision = decide_start(definition, saga_id, encoded, partition.index, event, signer=signer)
        keep_trace(decision, trace)
        verdicts = await self._slots.gate([(decision, None)]) if self._slots.active else None
        if verdicts is not None and verdicts.refused:  # its key skips when busy, or is unreadable
            raise verdicts.refused[0]
        if self._rates.active:  # its first command may be over a rate limit: then it waits as a timer
            await self._rates.gate([(decision, None)])
        call, written = commit_call(
            partition,
            None,
            decision,
            event,
            delivery=None,
            now_ms=now,
            timer_now_ms=self.clock.script_now_ms(),
            retention_s=self.config.retention_s,
            seal=Seal(self.config.auth, orchestrator_of(definition.context.name)),
        )
        # concurrent starts share one pipelined round trip (see bus/_batcher.py)
        result = commit_result(await self._batcher.call(call))
        if result.outcome == "ok" and self._cache is not None:
            written.state.revision = result.revision
            self._cache.keep(written)
        if result.outcome == "ok" and verdicts is not None:  # a slot may have freed meanwhile
            await self._slots.settle(verdicts, {id(decision)})
        if result.outcome == "drained":
            raise drained_error(definition)
        if result.outcome == "conflict":
            check_existing(definition, await self.get(saga_id, context=definition.context.name), encoded)
        return saga_id

    def orchestrates(self, context: str) -> bool:
        """Whether this client writes ``context``'s sagas itself.

        It does with signing off, or when it holds the context's orchestrator keyring; else
        it asks the orchestrator through the inbox.
        """
        auth = self.config.auth
        return not auth.enabled or orchestrator_of(context) in auth.keyrings

    @rides_through
    async def get(self, saga_id: str, *, context: str | None = None) -> SagaState:
        """The saga's current state, branches included (:class:`SagaNotFound` if there is none).

        ``context`` names the saga's context; it may be left out only when this client's
        registry has one context (else :class:`UnknownDefinition` asks for it).
        """
        return await self._load(self._partition(self.registry.context(context).name, saga_id), saga_id)

    @rides_through
    async def _load(self, partition: Partition, saga_id: str) -> SagaState:
        loaded = await load_saga(self.redis, partition, saga_id)
        if loaded is None:
            raise SagaNotFound(saga_id)
        return loaded.state

    @rides_through
    async def _deliver(self, partition: Partition, envelope: Envelope) -> None:
        """Put ``envelope`` on the partition's inbox (a repeat of the same id is deduped)."""
        await self._publisher.publish_envelope(
            partition.inbox, envelope, audience=inbox_audience(partition.context)
        )

    @rides_through
    async def query(self, saga_id: str, *, context: str | None = None) -> SagaQuery:
        """The saga's status, current step, what it waits for (until when) and its deadline.

        For a signal wait the answer carries the resume token. Nothing is written.
        """
        state = await self.get(saga_id, context=context)
        partition = Partition(state.context, state.partition)
        ids = timer_ids(state)
        with redis_errors():
            scores = await self.redis.zmscore(partition.timers, ids)
        due = {i: int(score) for i, score in zip(ids, scores, strict=True) if score is not None}
        try:
            steps = [s.name for s in self.registry.get(state.name, state.version).steps]
        except UnknownDefinition:
            steps = list(state.steps)
        waits_for_signal = state.wait is not None and state.wait.kind == "signal"
        can_sign = self.can_make_tokens(state.context)
        signer = await self.signer(state.context) if waits_for_signal and can_sign else None
        return describe(state, due, signer, steps)

    async def signal(self, token: str, data: object = None, *, by: str = "") -> str:
        """Deliver a resume token with ``data``; return the id of the inbox entry.

        The token is checked first: a forged, tampered or malformed one raises
        :class:`~saga.InvalidToken` and nothing is written. ``data`` is checked against the
        step's output type (:class:`InvalidInput`): with the definition when this client has
        it, else with the type's schema its workers registered; the orchestrator checks it
        again either way. A wait that has ended already (its signal delivered, timed out,
        the saga cancelled or ended) raises :class:`~saga.WaitEnded` and nothing is sent;
        a repeat that races the first delivery is recorded by the saga and changes nothing.
        Data over the payload limit raises :class:`bus.PayloadTooLarge` and nothing is written.
        """
        ref = (await self.verifier(peek(token).context)).verify(token, now_ms=self.clock.now_ms())
        partition = Partition(ref.context, ref.partition)
        state = await self._load(partition, check_saga_id(ref.saga_id))
        check_wait(
            ref,
            context=ref.context,
            partition=ref.partition,
            saga_id=ref.saga_id,
            incarnation=state.created_ms,
        )
        check_wait_open(state, ref.step, ref.n)
        refuse_task_wait(state, ref.step, ref.n, by=by or self.source)
        encoded = await self._signal_data(state, ref.step, data)
        delivery = SignalDelivery(
            step=ref.step, n=ref.n, data=msgspec.Raw(encoded), by=by or self.source, token=token
        )
        with signal_span(state, ref.step, partition.inbox.key) as trace:
            envelope = Envelope(
                id=uuid7(),
                type=SIGNAL,
                payload=_json.encode(delivery),
                source=self.source,
                correlation_id=ref.saga_id,
                created_at_ms=self.clock.now_ms(),
                headers=trace_headers(*trace),
            )
            await self._deliver(partition, envelope)
        return envelope.id

    async def _signal_data(self, state: SagaState, step: str, data: object) -> bytes:
        """The signal's data encoded, checked by the definition here, else by its registered shape."""
        try:
            self.registry.get(state.name, state.version)
        except UnknownDefinition:
            shape = await self._shape(state.context, state.name, state.version)
            return encode_signal_by_shape(shape, state.name, state.version, step, data)
        return encode_signal(self.registry, state.name, state.version, step, data)

    async def _shape(self, context: str, name: str, version: int) -> Shape | None:
        """The shape a worker registered for ``name@version`` (cached; ``None`` if none)."""
        key = (context, name, version)
        if key not in self._shapes:
            self._shapes[key] = await Versions(self.redis).shape(context, name, version)
        return self._shapes[key]

    async def cancel(
        self, saga_id: str, *, context: str | None = None, reason: str = "", by: str = ""
    ) -> None:
        """Ask for the saga to be cancelled; its completed steps are compensated.

        The request is decided in order with the saga's other events; cancelling an ended
        saga is recorded and changes nothing.
        """
        await self.send(
            saga_id, CANCEL, OperatorRequest(by=by or self.source, reason=reason), context=context
        )

    async def send(
        self, saga_id: str, kind: str, request: OperatorRequest, *, context: str | None = None
    ) -> None:
        """Put an operator request for ``saga_id`` on its partition's inbox."""
        state = await self.get(saga_id, context=context)
        partition = Partition(state.context, state.partition)
        envelope = _request_envelope(
            uuid7(), kind, saga_id, request, source=self.source, now=self.clock.now_ms()
        )
        await self._deliver(partition, envelope)

    @rides_through
    async def list(
        self, status: SagaStatus | str, *, context: str | None = None, limit: int = 100
    ) -> list[str]:
        """Ids of sagas in ``status``, oldest first, from the per-status indexes (no scan)."""
        ctx = self.registry.context(context)
        ids: list[str] = []
        for index in range(ctx.partitions):
            key = Partition(ctx.name, index).by_status(SagaStatus(status).value)
            with redis_errors():
                members = await self.redis.zrange(key, 0, limit - 1)
            ids += [m.decode() for m in members]
        return ids[:limit]

    @rides_through
    async def counts(self, *, context: str | None = None) -> dict[tuple[str, str], int]:
        """Number of sagas per (``name@version``, status), summed over the partitions."""
        ctx = self.registry.context(context)
        totals: dict[tuple[str, str], int] = {}
        for index in range(ctx.partitions):
            with redis_errors():
                raw = await self.redis.hgetall(Partition(ctx.name, index).counts)
            for key, value in raw.items():
                definition, _, status = key.decode().rpartition("|")
                totals[(definition, status)] = totals.get((definition, status), 0) + int(value)
        return totals

    def _definition(self, definition: Saga[Any] | str, version: int | None) -> Saga[Any]:
        if isinstance(definition, str):
            if version is None:
                return self.registry.latest(definition)
            return self.registry.get(definition, version)
        if version is not None and version != definition.version:
            raise InvalidInput(f"version={version} contradicts the definition given ({definition.key})")
        return definition

    def _partition(self, context: str, saga_id: str) -> Partition:
        ctx = self.registry.context(context)
        return Partition(ctx.name, partition_of(saga_id, ctx.partitions))


def _decoded(data: object) -> bytes:
    try:
        return _json.encode(data)
    except (TypeError, msgspec.EncodeError) as error:
        raise InvalidInput(f"signal data is not encodable: {error}") from error


def encode_signal_by_shape(
    shape: Shape | None, name: str, version: int, step_name: str, data: object
) -> bytes:
    """Encode a signal's data, checked against the registered schema of the step's type."""
    encoded = _decoded(data)
    if shape is None:
        return encoded  # nothing registered: the orchestrator checks it
    try:
        step = shape.step_named(step_name)
    except KeyError:
        raise InvalidInput(f"{name}@{version} has no step {step_name!r}") from None
    if step.kind != "signal":
        raise InvalidInput(f"{name}@{version}.{step_name} does not wait for a signal")
    if step.output is None:
        return encoded
    try:
        return _json.encode(step.output.check(msgspec.json.decode(encoded)))
    except ValueError as error:
        raise InvalidInput(
            f"signal data is not a valid {step.output.name} for {name}@{version}.{step_name}: {error}"
        ) from error


def encode_signal(registry: Registry, name: str, version: int, step_name: str, data: object) -> bytes:
    """Encode a signal's data, checked against the step's output type when it is known here."""
    encoded = _decoded(data)
    try:
        step = registry.get(name, version).step_named(step_name)
    except (UnknownDefinition, KeyError):
        return encoded  # the orchestrator checks it
    if step.kind != "signal":
        raise InvalidInput(f"{name}@{version}.{step_name} does not wait for a signal")
    step.decode_output(encoded)
    return encoded


def _request_envelope(
    envelope_id: str, kind: str, saga_id: str, request: OperatorRequest, *, source: str, now: int
) -> Envelope:
    return Envelope(
        id=envelope_id,
        type=kind,
        payload=_json.encode(request),
        source=source,
        correlation_id=saga_id,
        created_at_ms=now,
    )
