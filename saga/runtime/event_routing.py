"""Waiting for another context's event: the context's index of waits, and routing events.

A saga's transition cannot write a context-wide index (it is another slot), so a wait is
registered in two steps, each atomic: the transition writes a ``WatchEvent`` command on the
partition's ``cmd:_waits`` stream, and the orchestrator's handler for that stream registers
the wait (``watch_event.lua``). The orchestrator also subscribes to every stream a wait
names (group ``<context>.waits``) and routes each event (``route_event.lua``): to the waits
registered for its key, or into a short buffer that a later registration looks at. Both
scripts run in one slot per (context, stream), so an event that comes before its wait is
never lost between them. Matches reach the saga as ``EventReceived`` on its partition inbox
with an id derived from the event and the wait, so a repeat is deduped by the publish
window and, after it, ignored by the decider (the wait has ended). The index itself
(its keys, both scripts and their in-memory twin) is :mod:`saga.store.wait_index`; this
module reads events and addresses the deliveries, and its :class:`EventRouter` is the
orchestrator's handler of both streams.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from bus import Clock, Delivery, Envelope, PermanentError, Publisher, Stream, derived_id
from bus.lowlevel import get_logger
from saga.definition.saga import Saga
from saga.definition.waits import EventWait
from saga.runtime.config import EngineConfig
from saga.runtime.protocol import EVENT, EventDelivery
from saga.store import wait_index
from saga.store.commit import WatchRequest
from saga.store.keys import Partition
from saga.store.wait_index import BufferedEvent, Waiter

_json = msgspec.json.Encoder()
_log = get_logger("redsaga.saga")


def delivery(
    context: str, waiter: Waiter, event: BufferedEvent, *, source: str, now_ms: int
) -> tuple[Stream, Envelope]:
    """The ``EventReceived`` inbox entry that tells ``waiter``'s saga the event came."""
    payload = EventDelivery(
        step=waiter.step, n=waiter.n, event_id=event.id, message_type=event.type, payload=event.payload
    )
    envelope = Envelope(
        id=derived_id(event.id, f"{waiter.saga_id}:{waiter.step}:{waiter.n}"),
        type=EVENT,
        payload=_json.encode(payload),
        source=source,
        correlation_id=waiter.saga_id,
        causation_id=event.id,
        created_at_ms=now_ms,
    )
    return Partition(context, waiter.partition).inbox, envelope


def event_waits(definitions: Iterable[Saga[Any]]) -> dict[Stream, list[EventWait]]:
    """Every event wait the definitions declare, by stream."""
    found: dict[Stream, list[EventWait]] = {}
    for definition in definitions:
        for step in definition.steps:
            if isinstance(step.wait, EventWait):
                found.setdefault(step.wait.stream, []).append(step.wait)
    return found


def keys_of(waits: Iterable[EventWait], envelope: Envelope) -> list[str]:
    """The correlation keys an event carries for the waits that await its type."""
    keys: list[str] = []
    for wait in waits:
        if wait.message_type != envelope.type:
            continue
        try:
            key = wait.key_of_event(envelope.decode(wait.message))
        except Exception as error:  # noqa: BLE001 - a bad event or key function must not stop routing
            _log.warning("cannot read the correlation key of an event", entry=envelope.id, error=str(error))
            continue
        if key not in keys:
            keys.append(key)
    return keys


class EventRouter:
    """A context's handler of its ``cmd:_waits`` registrations and of the events its sagas await.

    ``streams`` maps every stream a wait of ``definitions`` names to those waits; the
    orchestrator subscribes to each and registers :meth:`on_waits` and :meth:`on_event`.
    Deliveries go out through ``publisher``, addressed to ``audience`` (the orchestrator).
    """

    def __init__(
        self,
        redis: Any,
        context: str,
        definitions: Iterable[Saga[Any]],
        *,
        clock: Clock,
        config: EngineConfig,
        publisher: Publisher,
        audience: str,
    ) -> None:
        self.redis = redis
        self.context = context
        self.streams = event_waits(definitions)
        """The waits of the context's definitions, by the stream their events come on."""
        self.clock = clock
        self.config = config
        self._publisher = publisher
        self._audience = audience

    async def on_waits(self, envelope: Envelope, _delivery: Delivery) -> None:
        """Register (or remove) an event wait; deliver an event that came before it."""
        try:
            request = msgspec.json.decode(envelope.payload, type=WatchRequest)
        except (msgspec.DecodeError, RecursionError) as error:
            raise PermanentError(f"invalid event-wait registration: {error}") from error
        if envelope.type == "UnwatchEvent":
            await wait_index.unwatch(self.redis, self.context, request)
            return
        if envelope.type != "WatchEvent":
            raise PermanentError(f"unknown event-wait command {envelope.type!r}")
        early = await wait_index.watch(self.redis, self.context, request)
        if early is not None:
            await self._deliver([Waiter.of(request)], early)

    async def on_event(self, envelope: Envelope, delivery: Delivery) -> None:
        """Route another context's event to the sagas waiting for it (or buffer it)."""
        stream = delivery.stream
        event = BufferedEvent(id=envelope.id, type=envelope.type, payload=msgspec.Raw(envelope.payload))
        for key in keys_of(self.streams.get(stream, []), envelope):
            found = await wait_index.route(
                self.redis,
                self.context,
                stream,
                event,
                key,
                ttl_ms=self.config.event_buffer_s * 1000,
                cap=self.config.event_buffer_cap,
            )
            await self._deliver(found, event)

    async def _deliver(self, waiters: list[Waiter], event: BufferedEvent) -> None:
        if not waiters:
            return
        now = self.clock.now_ms()
        items = [delivery(self.context, w, event, source=self.context, now_ms=now) for w in waiters]
        await self._publisher.publish_many(items, audience=self._audience)
