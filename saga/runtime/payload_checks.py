"""What the orchestrator accepts from an inbox entry: every payload checked, then re-encoded.

A reply, a signal's data, a matched event and a force-completed step's output are stored in
the saga and its history. Before anything stores one it is decoded -- into the step's
declared type when there is one, as plain JSON otherwise -- and the engine keeps what it
encodes again, never the bytes it was given: a payload that is not JSON, not the declared
type, or nested deeper than the decoder goes (``RecursionError``) is refused with
:class:`bus.PermanentError`, so the entry is dead-lettered on its first delivery with the
reason, and the saga stays readable whatever a participant sent. Late and ignored replies
are checked the same way (they are recorded too).
"""

from __future__ import annotations

from typing import Any

import msgspec

from bus import Envelope, PermanentError, message_type
from saga.core.model import Event, EventReceived, ForceCompleted, SignalReceived, StepReplied
from saga.definition.saga import Saga

_json = msgspec.json.Encoder()
_any = msgspec.json.Decoder()


def accepted(definition: Saga[Any], event: Event, envelope: Envelope) -> Event:
    """``event`` with its payload checked and re-encoded (:class:`bus.PermanentError` if bad)."""
    if isinstance(event, StepReplied):
        return _reply(definition, event, envelope) if event.ok else event
    if isinstance(event, SignalReceived):
        step = _step(definition, event.step)
        typed = step.output_type if step is not None and step.kind == "signal" else None
        what = f"{definition.key}.{event.step}: signal data"
        return msgspec.structs.replace(event, data=_reencode(event.data, typed, what))
    if isinstance(event, EventReceived):
        payload = _reencode(event.payload, None, f"{definition.key}.{event.step}: event")
        return msgspec.structs.replace(event, payload=payload)
    if isinstance(event, ForceCompleted):  # typed by the admin, for a step or its compensation
        output = _reencode(event.output, None, f"{definition.key}.{event.step}: forced output")
        return msgspec.structs.replace(event, output=output)
    return event


def _reply(definition: Saga[Any], event: StepReplied, envelope: Envelope) -> StepReplied:
    step = _step(definition, event.step)
    typed = None
    if step is not None and event.kind == "do" and not step.local and step.output_type is not None:
        typed = step.output_type
        expected = message_type(typed)
        if envelope.type != expected:
            raise PermanentError(
                f"{definition.key}.{step.name} expects a {expected} reply, got {envelope.type}"
            )
    what = f"{definition.key}.{event.step}: {event.kind} reply"
    return msgspec.structs.replace(event, output=_reencode(event.output, typed, what))


def _step(definition: Saga[Any], name: str) -> Any:
    try:
        return definition.step_named(name)
    except KeyError:
        return None  # the decider records the entry as ignored


def _reencode(raw: msgspec.Raw, typed: type[Any] | None, what: str) -> msgspec.Raw:
    try:
        value = msgspec.json.decode(bytes(raw), type=typed) if typed is not None else _any.decode(bytes(raw))
    except RecursionError as error:
        raise PermanentError(f"{what} is nested too deeply to decode") from error
    except msgspec.DecodeError as error:  # ValidationError included
        name = typed.__name__ if typed is not None else "JSON value"
        raise PermanentError(f"{what} is not a valid {name}: {error}") from error
    return msgspec.Raw(_json.encode(value))
