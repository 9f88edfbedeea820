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
window and, after it, ignored by the decider (the wait has ended). The keys are
:class:`~saga.store.keys.WaitIndexKeys` (documented in ``saga/store/keys.py``).

(A wait that an operator redrive began again keeps its number ``n``; its field is
``...|<n>.<attempt>``, apart from the field of the registration the redrive removed.)

:class:`MemoryIndex` keeps the same rules in memory for the in-process test runner.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bus import Envelope, Stream, derived_id
from bus.lowlevel import get_logger
from saga.definition.saga import Saga
from saga.definition.waits import EventWait
from saga.runtime.protocol import EVENT, EventDelivery
from saga.store.commit import WatchRequest
from saga.store.keys import ContextKeys, Partition
from saga.store.scripts import ROUTE_EVENT, WATCH_EVENT

_json = msgspec.json.Encoder()
_log = get_logger("redsaga.saga")


class Waiter(msgspec.Struct, frozen=True, kw_only=True):
    """A registered wait: which saga, where, which step and wait."""

    saga_id: str
    partition: int
    step: str
    n: int


class BufferedEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event kept for a wait that has not registered yet."""

    id: str
    type: str
    payload: msgspec.Raw


_waiter = msgspec.json.Decoder(Waiter)
_buffered = msgspec.json.Decoder(BufferedEvent)


def _keys(context: str, stream: Stream, key: str) -> list[str]:
    index = ContextKeys(context).waits_on(stream)
    return [index.waits(key), index.early(key)]


def _field(request: WatchRequest) -> str:
    which = f"{request.n}.{request.attempt}" if request.attempt else str(request.n)
    return f"{request.message_type} {request.saga_id}|{request.step}|{which}"


def _waiter_of(request: WatchRequest) -> Waiter:
    return Waiter(saga_id=request.saga_id, partition=request.partition, step=request.step, n=request.n)


def _entry(event: BufferedEvent) -> bytes:
    return event.type.encode() + b" " + _json.encode(event)


def _decode_entry(raw: bytes) -> BufferedEvent:
    return _buffered.decode(raw.split(b" ", 1)[1])


async def watch(redis: Any, context: str, request: WatchRequest) -> BufferedEvent | None:
    """Register a wait; return an event of its type that came before it, if one is buffered."""
    stream = Stream.from_key(request.stream)
    found = await WATCH_EVENT(
        redis,
        _keys(context, stream, request.key),
        [_field(request), _json.encode(_waiter_of(request)), request.message_type],
    )
    return _decode_entry(found) if found else None


async def unwatch(redis: Any, context: str, request: WatchRequest) -> None:
    """Remove an ended wait's registration."""
    stream = Stream.from_key(request.stream)
    await redis.hdel(_keys(context, stream, request.key)[0], _field(request))


async def route(
    redis: Any, context: str, stream: Stream, event: BufferedEvent, key: str, *, ttl_ms: int, cap: int
) -> list[Waiter]:
    """The waits an event with ``key`` matches; with none, the event is buffered."""
    found = await ROUTE_EVENT(redis, _keys(context, stream, key), [event.type, _entry(event), ttl_ms, cap])
    return [_waiter.decode(raw) for raw in found]


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


@dataclass
class MemoryIndex:
    """The index of waits in memory, with the Redis scripts' rules (for the test runner)."""

    ttl_ms: int
    cap: int
    waits: dict[tuple[str, str], dict[str, Waiter]] = field(default_factory=dict)
    early: dict[tuple[str, str], tuple[int, list[BufferedEvent]]] = field(default_factory=dict)

    def watch(self, request: WatchRequest, now_ms: int) -> BufferedEvent | None:
        """Register a wait; return a buffered event of its type, if any."""
        slot = (request.stream, request.key)
        self.waits.setdefault(slot, {})[_field(request)] = _waiter_of(request)
        expires, events = self.early.get(slot, (0, []))
        if expires <= now_ms:
            return None
        return next((e for e in events if e.type == request.message_type), None)

    def unwatch(self, request: WatchRequest) -> None:
        """Remove an ended wait's registration."""
        self.waits.get((request.stream, request.key), {}).pop(_field(request), None)

    def route(self, stream: str, event: BufferedEvent, key: str, now_ms: int) -> list[Waiter]:
        """The waits an event matches; with none, buffer it."""
        slot = (stream, key)
        prefix = f"{event.type} "
        found = [w for f, w in self.waits.get(slot, {}).items() if f.startswith(prefix)]
        if not found:
            expires, events = self.early.get(slot, (0, []))
            events = events if expires > now_ms else []
            if event not in events:
                events = [*events, event][-self.cap :]
            self.early[slot] = (now_ms + self.ttl_ms, events)
        return found
