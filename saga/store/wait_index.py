"""A context's index of event waits: registering a wait, routing an event to its waits.

The keys are :class:`~saga.store.keys.WaitIndexKeys`; the rules are the two scripts
``watch_event.lua`` and ``route_event.lua`` (one slot per context and awaited stream, so an
event that comes before its wait is never lost between them). :class:`MemoryIndex` keeps
the same rules in memory for the in-process store; the store contract suite
(``tests/saga/test_store_contract.py``) gives both the same inputs and compares the index.

A wait's field is ``'<type> <saga>|<step>|<n>'``; a wait that an operator redrive began
again keeps its number ``n`` and its field is ``...|<n>.<attempt>``, apart from the field
of the registration the redrive removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from bus import Stream
from saga.store.commit import WatchRequest
from saga.store.keys import ContextKeys
from saga.store.scripts import ROUTE_EVENT, WATCH_EVENT

_json = msgspec.json.Encoder()


class Waiter(msgspec.Struct, frozen=True, kw_only=True):
    """A registered wait: which saga, where, which step and wait."""

    saga_id: str
    partition: int
    step: str
    n: int

    @classmethod
    def of(cls, request: WatchRequest) -> Waiter:
        """The waiter a registration registers."""
        return cls(saga_id=request.saga_id, partition=request.partition, step=request.step, n=request.n)


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
        [_field(request), _json.encode(Waiter.of(request)), request.message_type],
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


@dataclass
class MemoryIndex:
    """One context's index of waits in memory, with the Redis scripts' rules."""

    ttl_ms: int
    cap: int
    waits: dict[tuple[str, str], dict[str, Waiter]] = field(default_factory=dict)
    early: dict[tuple[str, str], tuple[int, list[BufferedEvent]]] = field(default_factory=dict)

    def watch(self, request: WatchRequest, now_ms: int) -> BufferedEvent | None:
        """Register a wait; return a buffered event of its type, if any."""
        slot = (request.stream, request.key)
        self.waits.setdefault(slot, {})[_field(request)] = Waiter.of(request)
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
