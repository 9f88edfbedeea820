"""The test runner's signals, other contexts' events and queries (part of ``SagaRunner``).

Signals go through the same token checks and data checks as ``SagaClient.signal``; events
go through the same key functions and the same index rules (``MemoryIndex``, the Redis
scripts' twin) as the orchestrator's subscription, and the event-wait registrations travel
on the runner's queue like the ``cmd:_waits`` commands they stand for, so a reordering
runner can deliver an event before, during or after its wait registers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from bus import Envelope, FakeClock, Stream, new_envelope
from saga.core.model import Event, SagaState, SignalReceived
from saga.core.query import SagaQuery, describe
from saga.core.tokens import Signer, check_wait, peek
from saga.core.wait_rules import next_wait
from saga.definition.registry import Registry
from saga.definition.saga import Saga, Step
from saga.errors import SagaNotFound
from saga.runtime import event_routing as waits
from saga.runtime.client import encode_signal
from saga.runtime.config import EngineConfig
from saga.runtime.protocol import to_event
from saga.store.commit import WatchRequest

TEST_SECRET = "saga.testing signal secret (not for production)"  # noqa: S105 - tests only
"""The runner's default signal secret: tokens are deterministic, so tests can compare them."""


@dataclass(frozen=True, slots=True)
class Watch:
    """A ``cmd:_waits`` command on its way to the orchestrator's handler."""

    context: str
    kind: str
    request: WatchRequest


@dataclass(frozen=True, slots=True)
class Published:
    """Another context's event on its way to one context's subscription."""

    context: str
    stream: Stream
    envelope: Envelope


class RunnerWaits:
    """Signals, events and queries for :class:`~saga.testing.SagaRunner`."""

    registry: Registry
    config: EngineConfig
    clock: FakeClock
    _signers: dict[str, Signer]
    _indexes: dict[str, waits.MemoryIndex]
    _delivered: set[str]
    _timers: dict[str, tuple[int, int, str, Any]]

    def state(self, saga_id: str) -> SagaState:
        """A copy of the saga's current state."""
        raise NotImplementedError

    def _enqueue(self, item: object) -> None:
        raise NotImplementedError

    def _enqueue_event(self, saga_id: str, event: Event) -> None:
        raise NotImplementedError

    def _has_saga(self, saga_id: str) -> bool:
        raise NotImplementedError

    def _definition_of(self, saga_id: str) -> Saga[Any]:
        raise NotImplementedError

    def _new_id(self, label: str) -> str:
        raise NotImplementedError

    # -- signals ---------------------------------------------------------------------------

    def signer(self, context: str) -> Signer:
        """The signer of ``context`` (from ``EngineConfig.signal_secret``, else a test secret)."""
        if context not in self._signers:
            self._signers[context] = Signer.from_secret(self.config.signal_secret or TEST_SECRET, context)
        return self._signers[context]

    def resume_token(self, saga_id: str, step: str | Step[Any, Any]) -> str:
        """The resume token of ``step``'s current (or next) wait, as ``ctx.resume_token`` makes it."""
        state = self.state(saga_id)
        name = step if isinstance(step, str) else step.name
        if self._definition_of(saga_id).step_named(name).kind != "signal":
            raise ValueError(f"step {name!r} does not wait for a signal")
        wait = state.wait
        n = wait.n if wait is not None and wait.step == name else next_wait(state.steps[name])
        return self.signer(state.context).token(
            state.partition, saga_id, name, n, incarnation=state.created_ms, now_ms=self.clock.now_ms()
        )

    def signal(self, token: str, data: object = None, *, by: str = "test") -> None:
        """Deliver a resume token with ``data``, as ``SagaClient.signal`` does (checks included).

        A forged or tampered token raises :class:`~saga.InvalidToken`, data of the wrong
        type :class:`~saga.InvalidInput`; either way nothing is queued.
        """
        ref = self.signer(peek(token).context).verify(token, now_ms=self.clock.now_ms())
        if not self._has_saga(ref.saga_id):
            raise SagaNotFound(ref.saga_id)
        state = self.state(ref.saga_id)
        check_wait(
            ref,
            context=state.context,
            partition=state.partition,
            saga_id=state.id,
            incarnation=state.created_ms,
        )
        encoded = encode_signal(self.registry, state.name, state.version, ref.step, data)
        event = SignalReceived(
            id=self._new_id("signal"),
            at_ms=self.clock.now_ms(),
            step=ref.step,
            n=ref.n,
            data=msgspec.Raw(encoded),
            by=by,
        )
        self._enqueue_event(ref.saga_id, event)

    # -- other contexts' events ------------------------------------------------------------

    def publish(self, stream: str | Stream, message: object, *, message_id: str | None = None) -> str:
        """Publish another context's event on ``stream``; waiting sagas see it on the next run.

        Returns the event's id. An event nobody waits for yet is kept (as in Redis) for
        ``EngineConfig.event_buffer_s`` of virtual time.
        """
        target = stream if isinstance(stream, Stream) else Stream.named(stream)
        envelope = new_envelope(
            message,
            max_bytes=self.config.bus.max_payload_bytes,
            source="test",
            message_id=message_id or self._new_id("event"),
        )
        envelope = msgspec.structs.replace(envelope, created_at_ms=self.clock.now_ms())
        for context in self.registry.contexts:
            definitions = [d for d in self.registry if d.context.name == context]
            if target in waits.event_waits(definitions):
                self._enqueue(Published(context, target, envelope))
        return envelope.id

    def _index(self, context: str) -> waits.MemoryIndex:
        if context not in self._indexes:
            self._indexes[context] = waits.MemoryIndex(
                ttl_ms=self.config.event_buffer_s * 1000, cap=self.config.event_buffer_cap
            )
        return self._indexes[context]

    def _handle_watch(self, item: Watch) -> None:
        index = self._index(item.context)
        if item.kind == "UnwatchEvent":
            index.unwatch(item.request)
            return
        early = index.watch(item.request, self.clock.now_ms())
        if early is not None:
            r = item.request
            waiter = waits.Waiter(saga_id=r.saga_id, partition=r.partition, step=r.step, n=r.n)
            self._deliver_event(item.context, [waiter], early)

    def _handle_published(self, item: Published) -> None:
        definitions = [d for d in self.registry if d.context.name == item.context]
        found = waits.event_waits(definitions).get(item.stream, [])
        envelope = item.envelope
        event = waits.BufferedEvent(id=envelope.id, type=envelope.type, payload=msgspec.Raw(envelope.payload))
        index = self._index(item.context)
        for key in waits.keys_of(found, envelope):
            matched = index.route(item.stream.key, event, key, self.clock.now_ms())
            self._deliver_event(item.context, matched, event)

    def _deliver_event(self, context: str, waiters: list[waits.Waiter], event: waits.BufferedEvent) -> None:
        for waiter in waiters:
            _, envelope = waits.delivery(context, waiter, event, source=context, now_ms=self.clock.now_ms())
            if envelope.id in self._delivered:  # the publish dedupe window
                continue
            self._delivered.add(envelope.id)
            self._enqueue_event(waiter.saga_id, to_event(envelope))

    # -- queries ---------------------------------------------------------------------------

    def query(self, saga_id: str) -> SagaQuery:
        """What ``SagaClient.query`` answers: status, current step, wait (until, token), deadline."""
        state = self.state(saga_id)
        due = {timer_id: t[0] for timer_id, t in self._timers.items() if t[2] == saga_id}
        signer = self.signer(state.context) if state.wait and state.wait.kind == "signal" else None
        steps = [s.name for s in self._definition_of(saga_id).steps]
        return describe(state, due, signer, steps)

    def _signer_for(self, definition: Saga[Any]) -> Signer | None:
        return self.signer(definition.context.name) if definition.takes_signals else None
