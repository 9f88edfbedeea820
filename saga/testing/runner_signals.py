"""The test runner's signals, other contexts' events and queries (an object ``SagaRunner`` composes).

Signals go through the same token checks and data checks as ``SagaClient.signal``; events
go through the same key functions and the same index rules (the memory store's, the Redis
scripts' twin) as the orchestrator's subscription, and the event-wait registrations travel
on the runner's queue like the ``cmd:_waits`` commands they stand for, so a reordering
runner can deliver an event before, during or after its wait registers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bus import FakeClock, Stream, new_envelope
from saga.core.model import SagaState, SignalReceived
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
from saga.store.memory import MemoryStore, completed
from saga.store.wait_index import BufferedEvent, Waiter
from saga.testing.runner_queue import EventItem, Item, Published, Watch

TEST_SECRET = "saga.testing signal secret (not for production)"  # noqa: S105 - tests only
"""The runner's default signal secret: tokens are deterministic, so tests can compare them."""


@dataclass
class Signals:
    """Signals, events and queries for :class:`~saga.testing.SagaRunner`: what it needs, given."""

    registry: Registry
    config: EngineConfig
    clock: FakeClock
    store: MemoryStore
    state: Callable[[str], SagaState]
    """A copy of a saga's state (:class:`~saga.SagaNotFound` if there is none)."""
    definition_of: Callable[[str], Saga[Any]]
    has_saga: Callable[[str], bool]
    new_id: Callable[[str], str]
    enqueue: Callable[[Item], None]
    signers: dict[str, Signer] = field(default_factory=dict)
    delivered: set[str] = field(default_factory=set)
    """Ids of event deliveries made (the publish dedupe window)."""

    # -- signals ---------------------------------------------------------------------------

    def signer(self, context: str) -> Signer:
        """The signer of ``context`` (from ``EngineConfig.signal_secret``, else a test secret)."""
        if context not in self.signers:
            self.signers[context] = Signer.from_secret(self.config.signal_secret or TEST_SECRET, context)
        return self.signers[context]

    def resume_token(self, saga_id: str, step: str | Step[Any, Any]) -> str:
        """The resume token of ``step``'s current (or next) wait, as ``ctx.resume_token`` makes it."""
        state = self.state(saga_id)
        name = step if isinstance(step, str) else step.name
        if self.definition_of(saga_id).step_named(name).kind != "signal":
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
        if not self.has_saga(ref.saga_id):
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
            id=self.new_id("signal"),
            at_ms=self.clock.now_ms(),
            step=ref.step,
            n=ref.n,
            data=msgspec.Raw(encoded),
            by=by,
        )
        self.enqueue(EventItem(ref.saga_id, event))

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
            message_id=message_id or self.new_id("event"),
        )
        envelope = msgspec.structs.replace(envelope, created_at_ms=self.clock.now_ms())
        for context in self.registry.contexts:
            definitions = [d for d in self.registry if d.context.name == context]
            if target in waits.event_waits(definitions):
                self.enqueue(Published(context, target, envelope))
        return envelope.id

    def handle_watch(self, item: Watch) -> None:
        """Register or remove an event wait, as the orchestrator's ``cmd:_waits`` handler does."""
        if item.kind == "UnwatchEvent":
            completed(self.store.unwatch(item.context, item.request))
            return
        early = completed(self.store.watch(item.context, item.request, self.clock.now_ms()))
        if early is not None:
            self._deliver(item.context, [Waiter.of(item.request)], early)

    def handle_published(self, item: Published) -> None:
        """Route another context's event to its waits, as the orchestrator's subscription does."""
        definitions = [d for d in self.registry if d.context.name == item.context]
        found = waits.event_waits(definitions).get(item.stream, [])
        envelope = item.envelope
        event = BufferedEvent(id=envelope.id, type=envelope.type, payload=msgspec.Raw(envelope.payload))
        for key in waits.keys_of(found, envelope):
            matched = completed(self.store.route(item.context, item.stream, event, key, self.clock.now_ms()))
            self._deliver(item.context, matched, event)

    def _deliver(self, context: str, waiters: list[Waiter], event: BufferedEvent) -> None:
        for waiter in waiters:
            _, envelope = waits.delivery(context, waiter, event, source=context, now_ms=self.clock.now_ms())
            if envelope.id in self.delivered:  # the publish dedupe window
                continue
            self.delivered.add(envelope.id)
            self.enqueue(EventItem(waiter.saga_id, to_event(envelope)))

    # -- queries ---------------------------------------------------------------------------

    def query(self, saga_id: str) -> SagaQuery:
        """What ``SagaClient.query`` answers: status, current step, wait (until, token), deadline."""
        state = self.state(saga_id)
        due = {t.timer_id: t.due_ms for t in self.store.every_timer() if t.saga_id == saga_id}
        signer = self.signer(state.context) if state.wait and state.wait.kind == "signal" else None
        steps = [s.name for s in self.definition_of(saga_id).steps]
        return describe(state, due, signer, steps)

    def signer_for(self, definition: Saga[Any]) -> Signer | None:
        """The signer a definition's decisions need (only sagas that take signals need one)."""
        return self.signer(definition.context.name) if definition.takes_signals else None
