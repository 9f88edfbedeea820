"""A saga's history as stored: entries that point at the step records instead of repeating them.

Each history entry (``rs:{ctx:p}:hist:<id>``, one JSON document per event) says what was
decided. A command's payload is also its attempt's input in the step record, a reply's
output its attempt's output, and both carry the attempt's command id, all written by the
same transition; the stored entry holds the JSON string ``"@"`` (``@`` for a command id)
in their place, and reading the history with the saga's state puts them back
(:func:`read_history`), so inspection, the UI, ``saga export`` and replay see every input
and output in full. Step records are never dropped while the history lives (an attempt,
once recorded, stays: a migration renames records but keeps every step that ran), so
every reference can be resolved.

A command payload is always a JSON object (a message Struct), but an output may be any JSON
value and a reply may carry any command id, so a real value that is a string of ``@`` only
is written with one ``@`` more and read back with one less: ``@`` alone is always a
reference.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec
from msgspec.structs import replace

from saga.core.model import Attempt, Dispatch, HistoryEntry, Kind, Migrated, SagaState, StepReplied
from saga.core.replay import decode_entries

REFERENCE: Final = msgspec.Raw(b'"@"')
"""What a stored entry holds in place of a value its step record has."""

_json = msgspec.json.Encoder()


def encode_entry(entry: HistoryEntry, state: SagaState) -> bytes:
    """``entry`` as stored, beside ``state`` (the saga as the same transition leaves it)."""
    effects = entry.effects
    if any(isinstance(e, Dispatch) for e in effects):
        effects = [_stored_dispatch(e, state) if isinstance(e, Dispatch) else e for e in effects]
    event = entry.event
    if isinstance(event, StepReplied):
        attempt = _attempt(state, event.step, event.kind, event.attempt)
        event = replace(
            event,
            command_id=_stored_text(event.command_id, attempt.command_id if attempt else None),
            output=_stored_raw(event.output, attempt.output if attempt else None),
        )
    if event is entry.event and effects is entry.effects:
        return _json.encode(entry)
    return _json.encode(replace(entry, event=event, effects=effects))


def read_history(raw: Iterable[bytes | str], state: SagaState) -> list[HistoryEntry]:
    """The stored entries of ``state``'s history (``LRANGE``), with every reference resolved.

    ``state`` must be at least as new as the entries (read in the same ``MULTI``, or after
    them), with its branch records. Raises ``msgspec.DecodeError`` for a reference that
    nothing in ``state`` resolves (a corrupt history).
    """
    entries = decode_entries(raw)
    names: dict[str, str] = {}  # a step's name at an entry -> its record's name now
    for entry in reversed(entries):
        event = entry.event
        if isinstance(event, Migrated):
            names = {old: names.get(new, new) for old, new in event.steps.items()}
            continue
        for e in entry.effects:
            if isinstance(e, Dispatch) and (_at_signs(e.payload) or _all_at(e.command_id)):
                attempt = _attempt(state, names.get(e.step, e.step), e.kind, e.attempt)
                e.payload = _read_raw(e.payload, attempt.input if attempt else None)
                e.command_id = _read_text(e.command_id, attempt.command_id if attempt else None)
        if isinstance(event, StepReplied) and (_at_signs(event.output) or _all_at(event.command_id)):
            attempt = _attempt(state, names.get(event.step, event.step), event.kind, event.attempt)
            event.output = _read_raw(event.output, attempt.output if attempt else None)
            event.command_id = _read_text(event.command_id, attempt.command_id if attempt else None)
    return entries


def _attempt(state: SagaState, step: str, kind: Kind, n: int) -> Attempt | None:
    record = state.branches.get(step) if "#" in step else state.steps.get(step)
    if record is not None:
        for attempt in reversed(record.attempts):
            if attempt.n == n and attempt.kind == kind:
                return attempt
    return None


def _stored_dispatch(dispatch: Dispatch, state: SagaState) -> Dispatch:
    attempt = _attempt(state, dispatch.step, dispatch.kind, dispatch.attempt)
    return replace(
        dispatch,
        command_id=_stored_text(dispatch.command_id, attempt.command_id if attempt else None),
        payload=_stored_raw(dispatch.payload, attempt.input if attempt else None),
    )


def _stored_raw(value: msgspec.Raw, recorded: msgspec.Raw | None) -> msgspec.Raw:
    """A JSON value as an entry stores it: a reference when the record holds it too."""
    if value == recorded:
        return REFERENCE
    return msgspec.Raw(b'"@' + bytes(value)[1:]) if _at_signs(value) else value


def _read_raw(value: msgspec.Raw, recorded: msgspec.Raw | None) -> msgspec.Raw:
    """The JSON value a stored one stands for (the inverse of :func:`_stored_raw`)."""
    if not _at_signs(value):
        return value
    if bytes(value) != bytes(REFERENCE):
        return msgspec.Raw(b'"' + bytes(value)[2:])
    if recorded is None:
        raise msgspec.DecodeError("the history refers to an attempt that the saga has no record of")
    return recorded


def _stored_text(value: str, recorded: str | None) -> str:
    """A command id as an entry stores it: ``@`` when the record holds it too."""
    if value == recorded:
        return "@"
    return "@" + value if _all_at(value) else value


def _read_text(value: str, recorded: str | None) -> str:
    """The command id a stored one stands for (the inverse of :func:`_stored_text`)."""
    if not _all_at(value):
        return value
    if value != "@":
        return value[1:]
    if recorded is None:
        raise msgspec.DecodeError("the history refers to an attempt that the saga has no record of")
    return recorded


def _all_at(value: str) -> bool:
    """Whether ``value`` is a string of ``@`` only (``@``, ``@@``, …)."""
    return bool(value) and not value.strip("@")


def _at_signs(value: msgspec.Raw) -> bool:
    """Whether ``value`` is a JSON string of ``@`` only (``"@"``, ``"@@"``, …)."""
    raw = bytes(value)
    return raw[:2] == b'"@' and raw[-1:] == b'"' and raw.count(b"@") == len(raw) - 2
