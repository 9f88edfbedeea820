"""Child sagas at runtime: starting and cancelling children, and reporting their end.

A child step (or branch) sends a ``StartChild`` command on the parent partition's
``cmd:_child`` stream, in its transition like any command; the parent context's
orchestrator handles it by starting the child through the client -- idempotent by the
child's id ``<parent id>/<step>``, so a redelivery starts nothing twice -- with a
:class:`~saga.core.model.ParentLink` naming the parent's attempt. Cancelling the parent (or its
deadline, or a first-of-N winner) sends ``CancelChild``, which puts a cancel request on the
child's inbox.

When the child ends, its final transition writes a ``ParentReport`` entry on the child's
own inbox (the transition's slot); the child context's orchestrator forwards it to the
parent's inbox as the reply to the parent's attempt (:func:`parent_reply`): the child's
output (its last step's output) when it completed, a permanent failure otherwise. The reply
id derives from the child's id and the parent's incarnation, so a repeated forward is
deduped by the publish window and, after it, ignored by the parent's decider (the attempt
has ended), while the child of a later parent under the same id reports under an id of its
own. It names the parent's
incarnation (the link's, under the child orchestrator's MAC) as a participant's reply does,
so a report copied into a later parent under the same id is refused as a replay.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bus import Clock, Delivery, Envelope, PermanentError, Publisher, TransientError, derived_id, message_type
from bus.lowlevel import get_logger
from bus.tracing import trace_headers
from saga.core.child_messages import CancelChild, StartChild
from saga.definition.composition import child_output_type
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.errors import InvalidInput, SagaExists, SagaNotFound, UnknownDefinition, VersionDrained
from saga.runtime.client import SagaClient
from saga.runtime.config import EngineConfig
from saga.runtime.protocol import FAILED, SUCCEEDED, StepFailed, StepSucceeded
from saga.runtime.saga_cache import SagaCache
from saga.runtime.tracing import trace_of
from saga.store.commit import ParentReport
from saga.store.keys import Partition
from saga.store.trust import INCARNATION, orchestrator_of

_log = get_logger("redsaga.saga")
_json = msgspec.json.Encoder()
_start = msgspec.json.Decoder(StartChild)
_cancel = msgspec.json.Decoder(CancelChild)
_report = msgspec.json.Decoder(ParentReport)
CHILD_FAILED = "ChildSagaFailed"
"""The ``error_type`` of the failure a parent step gets when its child did not complete."""
NOT_STARTED = (VersionDrained, InvalidInput, SagaExists, msgspec.DecodeError)
"""Why a child saga may not start: its version is drained, its data is refused, its id is
taken by another saga. Its parent's step fails for good with :func:`not_started`'s report."""


def not_started(command: StartChild, error: Exception) -> ParentReport:
    """The end report of a child saga that could not start (``error``, one of :data:`NOT_STARTED`)."""
    return ParentReport(
        child=command.saga_id,
        saga=command.saga,
        parent=command.parent,
        status="not_started",
        ok=False,
        error=f"child saga {command.saga_id} could not start: {type(error).__name__}: {error}",
    )


def child_definition(registry: Registry, envelope: Envelope) -> Saga[Any]:
    """The child definition a ``cmd:_child`` command is about (from the parent's step)."""
    name, _, version = envelope.headers.get("saga", "").rpartition("@")
    try:
        parent = registry.get(name, int(version))
        step = parent.step_named(envelope.headers.get("step", ""))
    except (UnknownDefinition, KeyError, ValueError) as error:
        raise TransientError(f"cannot handle a child-saga command: {error}") from error
    if step.child is None:
        raise PermanentError(f"{parent.key}.{step.name} does not run a child saga")
    return step.child.definition


def parent_reply(
    report: ParentReport, output_type: Any, *, source: str, now_ms: int, trace: tuple[str, str] = ("", "")
) -> Envelope:
    """The reply the parent's attempt gets when its child ended (see the module docstring).

    ``trace`` is the child's trace context (the report's), which the reply carries on.
    """
    link = report.parent
    if report.ok and output_type is None:
        type_name, payload = SUCCEEDED, _json.encode(StepSucceeded(output=report.output))
    elif report.ok:
        type_name, payload = message_type(output_type), bytes(report.output)
    else:
        failure = StepFailed(error=report.error, error_type=CHILD_FAILED, permanent=True)
        type_name, payload = FAILED, _json.encode(failure)
    return Envelope(
        id=derived_id(report.child, f"ended:reply:{link.incarnation}"),
        type=type_name,
        payload=payload,
        source=source,
        correlation_id=link.saga_id,
        causation_id=link.command_id,
        created_at_ms=now_ms,
        attempt=link.attempt,
        headers={
            "saga": link.saga,
            "step": link.step,
            "kind": "do",
            "replied-by": report.child,
            **({INCARNATION: str(link.incarnation)} if link.incarnation else {}),
            **trace_headers(*trace),
        },
    )


def decode_report(envelope: Envelope) -> ParentReport:
    """A ``ParentReport`` inbox entry's payload."""
    try:
        return _report.decode(envelope.payload)
    except (msgspec.DecodeError, RecursionError) as error:
        raise PermanentError(f"invalid child end report: {error}") from error


class Children:
    """One context's child-saga plumbing (installed by its orchestrator).

    Child sagas it starts are kept in ``cache`` as written (see
    :class:`~saga.runtime.saga_cache.SagaCache`).
    """

    def __init__(
        self,
        redis: Any,
        registry: Registry,
        *,
        clock: Clock,
        config: EngineConfig,
        source: str,
        cache: SagaCache | None = None,
    ) -> None:
        self.redis = redis
        self.registry = registry
        self.clock = clock
        self.config = config
        self.source = source
        self._publisher = Publisher(
            redis, source=source, config=config.bus, auth=config.auth, principal=orchestrator_of(source)
        )
        self._clients: dict[str, SagaClient] = {}
        self._cache = cache

    def _client(self, definition: Saga[Any]) -> SagaClient:
        client = self._clients.get(definition.key)
        if client is None:
            client = SagaClient(
                self.redis,
                Registry([definition]),
                clock=self.clock,
                config=self.config,
                source=self.source,
                cache=self._cache,
            )
            self._clients[definition.key] = client
        return client

    async def on_command(self, envelope: Envelope, _delivery: Delivery) -> None:
        """Start a child saga, or cancel one (``cmd:_child``)."""
        definition = child_definition(self.registry, envelope)
        client = self._client(definition)
        if envelope.type == "StartChild":
            try:
                command = _start.decode(envelope.payload)
            except (msgspec.DecodeError, RecursionError) as error:
                raise PermanentError(f"invalid StartChild: {error}") from error
            try:
                data = definition.decode_data(command.data)
                await client.start(
                    definition,
                    data,
                    saga_id=command.saga_id,
                    parent=command.parent,
                    by=command.parent.saga_id,
                    trace=trace_of(envelope),  # kept if this process does not trace
                    wait_s=0,  # decided by the child context, which dead-letters a refusal with its reason
                )
            except NOT_STARTED as error:
                await self._refused(command, error)
            return
        if envelope.type == "CancelChild":
            try:
                cancel = _cancel.decode(envelope.payload)
            except (msgspec.DecodeError, RecursionError) as error:
                raise PermanentError(f"invalid CancelChild: {error}") from error
            try:
                await client.cancel(
                    cancel.saga_id, context=definition.context.name, reason=cancel.reason, by="parent saga"
                )
            except SagaNotFound as error:  # its start may still be on its way (or was refused)
                raise TransientError(f"child saga {cancel.saga_id} does not exist (yet)") from error
            return
        raise PermanentError(f"unknown child-saga command {envelope.type!r}")

    async def _refused(self, command: StartChild, error: Exception) -> None:
        """The child could not start: the parent's step fails (permanently) with the reason."""
        report = not_started(command, error)
        _log.warning("child saga not started", child=command.saga_id, error=report.error)
        reply = parent_reply(report, None, source=self.source, now_ms=self.clock.now_ms())
        link = command.parent
        inbox = Partition(link.context, link.partition).inbox
        await self._publisher.publish_envelope(inbox, reply, audience=orchestrator_of(link.context))

    async def forward(self, envelope: Envelope) -> None:
        """Forward a child's end report (an entry of its own inbox) to its parent's inbox."""
        report = decode_report(envelope)
        name, _, version = report.saga.rpartition("@")
        try:
            definition = self.registry.get(name, int(version))
        except (UnknownDefinition, ValueError) as error:
            raise TransientError(f"{error}; a worker serving it must forward this report") from error
        output_type = child_output_type(definition) if report.ok else None
        reply = parent_reply(
            report, output_type, source=self.source, now_ms=self.clock.now_ms(), trace=trace_of(envelope)
        )
        link = report.parent
        inbox = Partition(link.context, link.partition).inbox
        await self._publisher.publish_envelope(inbox, reply, audience=orchestrator_of(link.context))
