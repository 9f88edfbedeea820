"""What a waiting step waits for: a sleep, a signal, or another context's event.

These are the ``wait`` of a :class:`~saga.definition.step.Step` whose ``kind`` is ``"sleep"``, ``"signal"``
or ``"event"``; :meth:`Saga.sleep`, :meth:`Saga.wait_signal` and :meth:`Saga.wait_event`
build them. The decider calls :meth:`Sleep.target` and :meth:`EventWait.key_of_data`;
the orchestrator calls :meth:`EventWait.key_of_event` on every event of the stream.
Functions given here must be pure (replay calls them again).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from redsaga.ids import message_type
from redsaga.streams import Stream
from saga.definition.where import Where

WAITS: Final = "_waits"
"""The participant name of event-wait registrations (handled by the orchestrator)."""

Duration = timedelta | datetime
"""How long to sleep (a ``timedelta``) or until when (an aware ``datetime``)."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Sleep for a duration or until a time, fixed or computed from the saga's data."""

    duration: Duration | Callable[[Any], Duration]

    def target(self, data: object) -> tuple[int, int | None]:
        """``(delay_ms, at_ms)``: a delay from the commit, or an absolute Unix time in ms."""
        value = self.duration(data) if callable(self.duration) else self.duration
        if isinstance(value, datetime):
            if value.tzinfo is None or value.utcoffset() is None:
                raise ValueError(f"sleep until {value!r}: give an aware datetime (with a timezone)")
            return 0, int(value.timestamp() * 1000)
        if isinstance(value, timedelta):
            return max(0, int(value.total_seconds() * 1000)), None
        raise TypeError(f"a sleep lasts a timedelta or ends at a datetime, not {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class SignalWait:
    """Wait for someone to deliver the step's resume token (``SagaClient.signal``)."""


@dataclass(frozen=True, slots=True)
class EventWait:
    """Wait for an event on ``stream`` whose ``key(event)`` equals ``match(data)``."""

    stream: Stream
    message: type[Any]
    key: Callable[[Any], object]
    match: Callable[[Any], object]

    @property
    def message_type(self) -> str:
        """The wire type name of the awaited event."""
        return message_type(self.message)

    def key_of_data(self, data: object) -> str:
        """The correlation key this saga waits for."""
        return _key(self.match(data))

    def key_of_event(self, event: object) -> str:
        """The correlation key an event carries."""
        return _key(self.key(event))


WaitSpec = Sleep | SignalWait | EventWait


def _key(value: object) -> str:
    if value is None or value == "":
        raise ValueError("a correlation key must not be empty")
    return str(value)


def check_one_argument(function: object, where: Where, what: str) -> None:
    """A wait's function takes exactly one argument (the saga's data, or the event)."""
    if not callable(function):
        raise where.error(f"{what} must be callable")
    parameters = [
        p
        for p in inspect.signature(function).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(parameters) != 1:
        raise where.error(f"{what} takes one argument, not {len(parameters)}")


def check_duration(duration: object, where: Where) -> None:
    """A fixed sleep must be a non-negative ``timedelta`` or an aware ``datetime``."""
    if callable(duration):
        check_one_argument(duration, where, "a computed sleep duration")
        return
    if isinstance(duration, datetime):
        if duration.tzinfo is None or duration.utcoffset() is None:
            raise where.error("sleep until an aware datetime (with a timezone)")
        return
    if not isinstance(duration, timedelta) or duration < timedelta():
        raise where.error(f"sleep for a timedelta >= 0 or until a datetime, not {duration!r}")
