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
module reads events and addresses the deliveries.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from bus import Envelope, Stream, derived_id
from bus.lowlevel import get_logger
from saga.definition.saga import Saga
from saga.definition.waits import EventWait
from saga.runtime.protocol import EVENT, EventDelivery
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
