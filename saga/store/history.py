"""A saga's history as stored: compact MessagePack entries that point at the saga hash.

Each history entry (``rs:{ctx:p}:hist:<id>``, one list element per event) says what was
decided: a :class:`~saga.core.history_entry.HistoryEntry`, written by :func:`encode_entry` as a
MessagePack array of format :data:`FORMAT`::

    [FORMAT, event, [effect, …], status, revision, ignored]

Every event and effect is an array too, its type's number first (``_EVENTS``, ``_EFFECTS``)
and then its fields in the model's order; no field name is written, and a field at its
default takes one byte (``nil``, ``false``, ``0``, ``""``). A JSON value (a payload, an
output, the saga's data) stays the JSON the message carried, as a MessagePack binary.

Where the saga hash holds a value for sure, or the entry itself does, it is left out
(``nil`` in its place, or a shorter form of the effect) and put back on reading
(:func:`read_history`), so inspection, the UI, ``saga export`` and replay see every entry
whole:

- a dispatched command whose attempt's record (written by the same transition) holds its
  command id, participant, message type and payload is only its step, kind, attempt and
  timeout (``_DISPATCH_REF``);
- a reply's time, command id, output and worker, when its attempt's record holds them
  (its end, command id, output and worker: an attempt's end is set once, by the event
  that ends it);
- the start's time, when it is the saga's creation (always, but for a hand-made entry);
- the start's data, when it is the saga's ``data`` (a migration that changes the data
  stores the data before it, so the start still reads back as it was), and the
  definition it started on (``name@version``; a migration names the version before it);
- a step's timeout timer next to its command: its id, delay, step, kind and attempt are
  the command's (``_TIMEOUT``); any other timer's id when it is the one the decider makes
  from its own fields (``<saga id>:<step>:<kind>:<attempt>:<purpose>``), and a cancelled
  timer's when it is the timeout of the attempt the entry's reply answers.

Step records are never dropped while the history lives (an attempt, once recorded, stays: a
migration renames records but keeps every step that ran), so every reference resolves.
Positions are the contract: a new model field goes at the end of its Struct, with a
default, and a type's number is never reused (``tests/saga/test_history_refs.py`` pins the
bytes of a stored entry).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from typing import Any, Final

import msgspec
from msgspec.structs import astuple

from saga.core.effects import (
    CancelTimer,
    Dispatch,
    Effect,
    NotifyParent,
    StartTimer,
    UnwatchEvent,
    WatchEvent,
)
from saga.core.history_entry import HistoryEntry
from saga.core.model import (
    Attempt,
    CancelRequested,
    EventReceived,
    ForceCompleted,
    Kind,
    Migrated,
    ParentLink,
    Recorded,
    RedriveRequested,
    RetryRequested,
    SagaState,
    SignalReceived,
    Started,
    StepReplied,
    TimerFired,
)
from saga.core.states import SagaStatus
from saga.core.timer_ids import attempt_timer_id

FORMAT: Final = 2
"""The stored form's number: the first element of every entry (a JSON entry starts ``{``;
1: before a reply's time and worker and the start's time were left out)."""


def _stored_type(kind: Any) -> Any:
    """A model field's type as stored: JSON values as binaries, a parent link as an array."""
    if kind is msgspec.Raw:
        return bytes
    if kind == dict[str, msgspec.Raw]:
        return dict[str, bytes]
    if kind == ParentLink | None:
        return _Parent | None
    return kind


def _mirror(
    model: type[msgspec.Struct],
    tag: int | None,
    *,
    refs: tuple[str, ...] = (),
    extra: tuple[tuple[str, Any, Any], ...] = (),
) -> type[msgspec.Struct]:
    """The stored form of ``model``: its fields in order, as an array; ``refs`` may be ``nil``."""
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for field in msgspec.structs.fields(model):
        kind = _stored_type(field.type)
        if field.name in refs:
            kind = kind | None
        if field.default_factory is not msgspec.NODEFAULT:
            fields.append((field.name, kind, msgspec.field(default_factory=field.default_factory)))
        elif isinstance(field.default, msgspec.Raw):
            fields.append((field.name, kind, bytes(field.default)))
        elif field.default is not msgspec.NODEFAULT:
            fields.append((field.name, kind, field.default))
        else:
            fields.append((field.name, kind))
    return msgspec.defstruct(
        f"Stored{model.__name__}", [*fields, *extra], array_like=True, tag=tag, frozen=True, gc=False
    )


_Parent = _mirror(ParentLink, None)
# The number of each event and effect type as stored; never reuse one.
_EVENTS: Final[dict[type[msgspec.Struct], type[msgspec.Struct]]] = {
    Started: _mirror(Started, 1, refs=("at_ms", "data", "saga")),
    StepReplied: _mirror(StepReplied, 2, refs=("at_ms", "command_id", "output", "worker")),
    TimerFired: _mirror(TimerFired, 3),
    CancelRequested: _mirror(CancelRequested, 4),
    RetryRequested: _mirror(RetryRequested, 5),
    ForceCompleted: _mirror(ForceCompleted, 6),
    RedriveRequested: _mirror(RedriveRequested, 7),
    SignalReceived: _mirror(SignalReceived, 8),
    EventReceived: _mirror(EventReceived, 9),
    # ``previous``: the saga's data before the migration, when the migration changed it.
    Migrated: _mirror(Migrated, 10, extra=(("previous", bytes | None, None),)),
}
_EFFECTS: Final[dict[type[msgspec.Struct], type[msgspec.Struct]]] = {
    Dispatch: _mirror(Dispatch, 1),
    StartTimer: _mirror(StartTimer, 2, refs=("timer_id",)),
    CancelTimer: _mirror(CancelTimer, 3, refs=("timer_id",)),
    WatchEvent: _mirror(WatchEvent, 4),
    UnwatchEvent: _mirror(UnwatchEvent, 5),
    NotifyParent: _mirror(NotifyParent, 6),
}
_DISPATCH_REF: Final = msgspec.defstruct(
    "StoredDispatchRef",
    [("step", str), ("kind", Kind), ("attempt", int), ("timeout_ms", int | None, None)],
    array_like=True,
    tag=7,
    frozen=True,
    gc=False,
)
"""A command whose attempt's record holds everything else it carries."""
_TIMEOUT: Final = msgspec.defstruct("StoredTimeout", [], array_like=True, tag=8, frozen=True, gc=False)
"""The timeout timer of the command just before it (all of it is the command's)."""


def _union(types: Iterable[Any]) -> Any:
    return functools.reduce(operator.or_, types)


_STORED_STARTED: Final[Any] = _EVENTS[Started]
_STORED_REPLIED: Final[Any] = _EVENTS[StepReplied]
_STORED_MIGRATED: Final[Any] = _EVENTS[Migrated]
_STORED_START: Final[Any] = _EFFECTS[StartTimer]
_STORED_CANCEL: Final[Any] = _EFFECTS[CancelTimer]
_STORED_DISPATCH: Final[Any] = _EFFECTS[Dispatch]


_MODELS: Final = {stored: model for model, stored in (*_EVENTS.items(), *_EFFECTS.items())}
_Entry: Final[Any] = msgspec.defstruct(
    "StoredEntry",
    [
        ("event", _union(_EVENTS.values())),
        ("effects", list.__class_getitem__(_union((*_EFFECTS.values(), _DISPATCH_REF, _TIMEOUT)))),
        ("status", SagaStatus),
        ("revision", int),
        ("ignored", str, ""),
    ],
    array_like=True,
    tag=FORMAT,
    frozen=True,
    gc=False,
)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Entry)


def encode_entry(entry: HistoryEntry, state: SagaState, *, before: SagaState | None = None) -> bytes:
    """``entry`` as stored, beside ``state`` (the saga as the same transition leaves it).

    A migration's entry needs the saga as it was ``before`` it (whose data it may replace).
    """
    event = entry.event
    saga_id = state.id
    effects: list[Any] = []
    last: Dispatch | None = None  # the command just before a timer
    for effect in entry.effects:
        kind = type(effect)
        if kind is Dispatch:
            effects.append(_stored_dispatch(effect, state))  # type: ignore[arg-type]
            last = effect  # type: ignore[assignment]
            continue
        if kind is StartTimer:
            effects.append(_stored_timer(effect, last, saga_id))  # type: ignore[arg-type]
        elif kind is CancelTimer:
            timer_id = effect.timer_id  # type: ignore[union-attr]
            effects.append(_STORED_CANCEL(None if timer_id == _timeout_of(event, saga_id) else timer_id))
        else:
            effects.append(_stored(effect, _EFFECTS[kind]))
        last = None
    stored = _Entry(_stored_event(event, state, before), effects, entry.status, entry.revision, entry.ignored)
    return _encoder.encode(stored)


def read_history(raw: Iterable[bytes | str], state: SagaState) -> list[HistoryEntry]:
    """The stored entries of ``state``'s history (``LRANGE``), whole again.

    ``state`` must be at least as new as the entries (read in the same ``MULTI``, or after
    them), with its branch records. Raises ``msgspec.DecodeError`` for an entry that is not
    of this :data:`FORMAT` or a reference that nothing resolves (a corrupt history).
    """
    stored = [_decode(item) for item in raw]
    seen = _Seen(state)
    # newest first: a migration renames (and may re-version) what came before it
    entries = [seen.entry(item) for item in reversed(stored)]
    entries.reverse()
    return entries


def event_id(raw: bytes | str) -> str:
    """The id of the event a stored entry records (read without its saga)."""
    return str(_decode(raw).event.id)


class _Seen:
    """What the saga was at an entry, going back from ``state`` through its migrations."""

    def __init__(self, state: SagaState) -> None:
        self.state = state
        self.names: dict[str, str] = {}  # a step's name at an entry -> its record's name now
        self.version = state.version
        self.data = state.data

    def entry(self, stored: Any) -> HistoryEntry:
        event = self.event(stored.event)
        effects: list[Effect] = []
        for item in stored.effects:
            effects.append(self.effect(item, event, effects[-1] if effects else None))
        entry = HistoryEntry(
            event=event,
            effects=effects,
            status=stored.status,
            revision=stored.revision,
            ignored=stored.ignored,
        )
        if isinstance(event, Migrated):
            self.names = {old: self.names.get(new, new) for old, new in event.steps.items()}
            self.version = event.from_version
            if stored.event.previous is not None:
                self.data = msgspec.Raw(stored.event.previous)
        return entry

    def attempt(self, step: str, kind: Kind, n: int) -> Attempt:
        found = _attempt(self.state, self.names.get(step, step), kind, n)
        if found is None:
            raise msgspec.DecodeError(
                f"the history refers to attempt {n} of {step}/{kind}, which the saga has no record of"
            )
        return found

    def event(self, stored: Any) -> Recorded:
        kind = type(stored)
        if kind is _STORED_STARTED:
            parent = stored.parent
            return Started(
                id=stored.id,
                at_ms=self.state.created_ms if stored.at_ms is None else stored.at_ms,
                data=self.data if stored.data is None else msgspec.Raw(stored.data),
                by=stored.by,
                saga=f"{self.state.name}@{self.version}" if stored.saga is None else stored.saga,
                steps=stored.steps,
                parent=None if parent is None else ParentLink(**msgspec.structs.asdict(parent)),
            )
        if kind is _STORED_REPLIED:
            return self.replied(stored)
        return _model(stored)  # type: ignore[no-any-return]

    def replied(self, stored: Any) -> StepReplied:
        """A reply whole again: what it left out is its attempt's."""
        if None not in (stored.at_ms, stored.command_id, stored.output, stored.worker):
            return _model(stored)  # type: ignore[no-any-return]
        attempt = self.attempt(stored.step, stored.kind, stored.attempt)
        return StepReplied(
            **msgspec.structs.asdict(stored)
            | {
                "at_ms": attempt.ended_ms if stored.at_ms is None else stored.at_ms,
                "command_id": attempt.command_id if stored.command_id is None else stored.command_id,
                "output": attempt.output if stored.output is None else msgspec.Raw(stored.output),
                "worker": (attempt.worker or "") if stored.worker is None else stored.worker,
            }
        )

    def effect(self, stored: Any, event: Recorded, last: Effect | None) -> Effect:
        kind = type(stored)
        if kind is _DISPATCH_REF:
            attempt = self.attempt(stored.step, stored.kind, stored.attempt)
            return Dispatch(
                step=stored.step,
                kind=stored.kind,
                attempt=stored.attempt,
                participant=attempt.participant,
                command_id=attempt.command_id,
                message_type=attempt.input_type,
                payload=attempt.input,
                timeout_ms=stored.timeout_ms,
            )
        if kind is _TIMEOUT:
            if not isinstance(last, Dispatch) or last.timeout_ms is None:
                raise msgspec.DecodeError("a history entry has a command's timeout timer without the command")
            return StartTimer(
                timer_id=attempt_timer_id(self.state.id, last.step, last.kind, last.attempt, "timeout"),
                delay_ms=last.timeout_ms,
                purpose="timeout",
                step=last.step,
                kind=last.kind,
                attempt=last.attempt,
            )
        if kind is _STORED_START and stored.timer_id is None:
            fields = msgspec.structs.asdict(stored)
            fields["timer_id"] = attempt_timer_id(
                self.state.id, stored.step, stored.kind, stored.attempt, stored.purpose
            )
            return StartTimer(**fields)
        if kind is _STORED_CANCEL and stored.timer_id is None:
            timer_id = _timeout_of(event, self.state.id)
            if timer_id is None:
                raise msgspec.DecodeError("a history entry cancels the timeout of a reply it does not record")
            return CancelTimer(timer_id=timer_id)
        return _model(stored)  # type: ignore[no-any-return]


def _raw_fields(model: type[msgspec.Struct]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Positions of ``model``'s JSON values: single ones, and maps of them."""
    fields = msgspec.structs.fields(model)
    return (
        tuple(i for i, f in enumerate(fields) if f.type is msgspec.Raw),
        tuple(i for i, f in enumerate(fields) if f.type == dict[str, msgspec.Raw]),
    )


_RAW: Final = {model: _raw_fields(model) for model in (*_EVENTS, *_EFFECTS)}
_NAMES: Final = {model: model.__struct_fields__ for model in (*_EVENTS, *_EFFECTS)}


def _stored(value: msgspec.Struct, stored: Any) -> Any:
    """``value`` in its stored form ``stored``, field for field."""
    fields = list(astuple(value))
    single, maps = _RAW[type(value)]
    for i in single:
        fields[i] = bytes(fields[i])
    for i in maps:
        fields[i] = {key: bytes(item) for key, item in fields[i].items()}
    return stored(*fields)


def _model(stored: Any) -> Any:
    """The model value a stored one is (the inverse of :func:`_stored`)."""
    model = _MODELS[type(stored)]
    names = _NAMES[model]
    fields = list(astuple(stored))[: len(names)]
    single, maps = _RAW[model]
    for i in single:
        fields[i] = msgspec.Raw(fields[i])
    for i in maps:
        fields[i] = {key: msgspec.Raw(item) for key, item in fields[i].items()}
    return model(**dict(zip(names, fields, strict=True)))


def _stored_event(event: Recorded, state: SagaState, before: SagaState | None) -> Any:
    kind = type(event)
    if kind is StepReplied:
        replied: StepReplied = event  # type: ignore[assignment]
        attempt = _attempt(state, replied.step, replied.kind, replied.attempt)
        return _STORED_REPLIED(
            replied.id,
            None if attempt is not None and attempt.ended_ms == replied.at_ms else replied.at_ms,
            replied.step,
            replied.kind,
            replied.attempt,
            None if attempt is not None and attempt.command_id == replied.command_id else replied.command_id,
            replied.ok,
            None if attempt is not None and attempt.output == replied.output else bytes(replied.output),
            replied.error,
            replied.error_type,
            replied.permanent,
            None if attempt is not None and (attempt.worker or "") == replied.worker else replied.worker,
        )
    if kind is Started:
        started: Started = event  # type: ignore[assignment]
        parent = started.parent
        return _STORED_STARTED(
            started.id,
            None if started.at_ms == state.created_ms else started.at_ms,
            None if started.data == state.data else bytes(started.data),
            started.by,
            None if started.saga == f"{state.name}@{state.version}" else started.saga,
            started.steps,
            None if parent is None else _Parent(*astuple(parent)),
        )
    if kind is Migrated:
        if before is None:
            raise ValueError("a migration's history entry needs the saga as it was before it")
        migrated: Migrated = event  # type: ignore[assignment]
        stored = _stored(migrated, _STORED_MIGRATED)
        changed = before.data != migrated.data
        return msgspec.structs.replace(stored, previous=bytes(before.data) if changed else None)
    return _stored(event, _EVENTS[kind])


def _stored_dispatch(dispatch: Dispatch, state: SagaState) -> Any:
    """A command as stored: only where its attempt is, when its record holds the rest."""
    attempt = _attempt(state, dispatch.step, dispatch.kind, dispatch.attempt)
    if (
        attempt is not None
        and attempt.command_id == dispatch.command_id
        and attempt.input == dispatch.payload
        and attempt.participant == dispatch.participant
        and attempt.input_type == dispatch.message_type
    ):
        return _DISPATCH_REF(dispatch.step, dispatch.kind, dispatch.attempt, dispatch.timeout_ms)
    return _stored(dispatch, _STORED_DISPATCH)


def _stored_timer(timer: StartTimer, last: Dispatch | None, saga_id: str) -> Any:
    """A timer as stored: nothing for a command's timeout, no id when it is the derived one."""
    derived = timer.timer_id == attempt_timer_id(
        saga_id, timer.step, timer.kind, timer.attempt, timer.purpose
    )
    if (
        derived
        and last is not None
        and timer.purpose == "timeout"
        and timer.at_ms is None
        and timer.delay_ms == last.timeout_ms
        and (timer.step, timer.kind, timer.attempt) == (last.step, last.kind, last.attempt)
    ):
        return _TIMEOUT()
    return _STORED_START(
        None if derived else timer.timer_id,
        timer.delay_ms,
        timer.purpose,
        timer.step,
        timer.kind,
        timer.attempt,
        timer.at_ms,
    )


def _timeout_of(event: Recorded, saga_id: str) -> str | None:
    """The timeout timer of the attempt ``event`` answers, if it is a reply."""
    if type(event) is not StepReplied:
        return None
    return attempt_timer_id(saga_id, event.step, event.kind, event.attempt, "timeout")


def _decode(raw: bytes | str) -> Any:
    data = raw.encode() if isinstance(raw, str) else raw
    if data[:1] == b"{":
        raise msgspec.DecodeError("a history entry in JSON, the form before MessagePack: not read any more")
    return _decoder.decode(data)


def _attempt(state: SagaState, step: str, kind: Kind, n: int) -> Attempt | None:
    record = state.branches.get(step) if "#" in step else state.steps.get(step)
    if record is not None:
        for attempt in reversed(record.attempts):
            if attempt.n == n and attempt.kind == kind:
                return attempt
    return None
