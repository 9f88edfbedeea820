"""What travels on the in-process runner's one queue, and the runner's errors.

Commands on their way to participants, events on their way to a saga, event-wait
registrations on their way to the orchestrator's handler (the ``cmd:_waits`` commands
they stand for) and other contexts' events on their way to a subscription: one queue, so
a reordering runner can interleave them as concurrent workers may.
"""

from __future__ import annotations

from dataclasses import dataclass

from bus import Envelope, Stream
from saga.core.model import Event, Kind
from saga.store.commit import WatchRequest
from saga.store.keys import Partition

CONSUMER = "saga-runner"
"""The consumer name the runner's deliveries carry (attempts record it as their worker)."""


@dataclass(frozen=True, slots=True)
class CommandItem:
    """A command on its way to a participant."""

    saga_id: str
    partition: Partition
    participant: str
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class EventItem:
    """An event on its way to its saga (a reply carries its envelope, for the output check)."""

    saga_id: str
    event: Event
    envelope: Envelope | None = None


@dataclass(frozen=True, slots=True)
class Held:
    """A reply held back until its attempt is given up on (``Response.late``)."""

    item: EventItem
    step: str
    kind: Kind
    command_id: str


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


Item = CommandItem | EventItem | Watch | Published
"""Anything on the runner's queue."""
