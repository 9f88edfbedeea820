"""A saga's state as the fields of its Redis hash, and back. Pure: no Redis call here.

A saga hash holds small fields so that a transition rewrites only what changed::

    rev      the revision (optimistic concurrency; written by the script only)
    tag      a random tag written with every revision: a revision lost (AOF tail, failover)
             and made again by another commit differs in its tag, so a cached copy of the
             lost one cannot commit onto the new one
    status   lifecycle status            name, version   the definition it runs
    created  creation time (ms)          updated         last change (ms)
    data     the start data (JSON)       meta            the format (:data:`FORMAT`), cursor,
                                                         completed steps, notes, the current
                                                         wait, early signals, the parent
    s:<step> one step's state with every attempt but what each attempt's dispatch set
    i:<step>:<i>  what the dispatch of the step's attempt ``i`` (its index) set: command id,
             participant, message type, input, dispatch time; written once, so the commits
             that change the record later (the reply, a retry) leave the input alone
    trace    the W3C traceparent of the saga's start, when it was traced (written once)
    tstate   the W3C tracestate that came with it, if any

``meta``, the step records and the starts are MessagePack: ``meta`` a map with one-letter
names and no default written, a step record, its attempts and their starts arrays in their
Structs' field order (a branch record, in the branch hash, holds its attempts' starts). The
context and partition are the key's; an attempt's command id is left out when it is the
derived one (``derived_id(saga id, '<step>:<kind>:<n>')``, what the decider makes), a
step's output when it is one of its attempts' (its index instead), and its timer when it is
its last attempt's timeout or retry timer, which the decider names
``<saga id>:<step>:<kind>:<n>:<purpose>`` (1 or 2 instead). A step's status, an attempt's
kind and outcome are small integers (:data:`STEP_STATUSES`, :data:`KINDS`, :data:`OUTCOMES`).
The inputs and outputs inside stay the JSON the messages carried, a ``null`` as ``nil``.

The records of a group step's branches live in a hash of their own, written by the same
script (``saga/store/branches.py``), so the saga hash stays small however many branches run.

The commit of a transition (:mod:`saga.store.commit`) writes these fields; replay
(:mod:`saga.core.replay`) encodes the states it rebuilds the same way, to predict the
revisions the store wrote.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Final

import msgspec

from redsaga.ids import derived_id
from saga.core.model import (
    NULL,
    Attempt,
    GroupState,
    Kind,
    Note,
    Outcome,
    ParentLink,
    SagaState,
    StepState,
    Wait,
)
from saga.core.states import SagaStatus, StepStatus
from saga.core.timer_ids import attempt_timer_id

STEP_PREFIX: Final = "s:"
START_PREFIX: Final = "i:"
"""Of the field ``i:<step>:<index>``: the start of the step's attempt at that index."""
FORMAT: Final = 4
"""The layout of ``meta`` and the step records, written in ``meta`` (1: JSON, with the
context and partition in ``meta`` and every command id written out; 2: MessagePack, meta a
map with short names and step records arrays, nothing the key or a derivation says; 3: an
attempt's start in a field of its own, ``i:<step>:<i>``, and a derivable timer left out; 4:
statuses, kinds and outcomes as their codes, a JSON ``null`` as ``nil``)."""

STEP_STATUSES: Final[tuple[StepStatus, ...]] = (
    StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.DISPATCHED, StepStatus.WAITING,
    StepStatus.RETRYING, StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.COMPENSATING,
    StepStatus.COMPENSATION_RETRYING, StepStatus.COMPENSATED, StepStatus.COMPENSATION_FAILED,
    StepStatus.CONFIRMING, StepStatus.CONFIRM_RETRYING, StepStatus.CONFIRMED, StepStatus.CONFIRM_FAILED,
)  # fmt: skip
"""A step's status as stored: its index here (append only: a code is never reused)."""
KINDS: Final[tuple[Kind, ...]] = ("do", "undo", "confirm")
"""An attempt's kind as stored: its index here (append only)."""
OUTCOMES: Final[tuple[Outcome, ...]] = ("ok", "transient", "permanent", "timeout", "cancelled", "forced")
"""An attempt's outcome as stored: its index here (append only)."""

_STATUS_CODES: Final = {status: code for code, status in enumerate(STEP_STATUSES)}
_KIND_CODES: Final = {kind: code for code, kind in enumerate(KINDS)}
_OUTCOME_CODES: Final = {outcome: code for code, outcome in enumerate(OUTCOMES)}
_StatusCode = Annotated[int, msgspec.Meta(ge=0, lt=len(STEP_STATUSES))]
_KindCode = Annotated[int, msgspec.Meta(ge=0, lt=len(KINDS))]
_OutcomeCode = Annotated[int, msgspec.Meta(ge=0, lt=len(OUTCOMES))]

_pack = msgspec.msgpack.Encoder()
_command_id = functools.lru_cache(maxsize=4096)(derived_id)


class _Start(msgspec.Struct, gc=False, array_like=True):
    """What an attempt's dispatch sets and nothing later changes (an array)."""

    command_id: str
    """``""``: the id derived from the saga, the record's key, the kind and ``n``."""
    participant: str
    input_type: str
    input: bytes
    dispatched_ms: int


class _Attempt(msgspec.Struct, gc=False, array_like=True):
    """An :class:`~saga.core.model.Attempt` as stored (an array, written by :func:`_trimmed`)."""

    n: int
    kind: _KindCode
    start: _Start | None = None
    """``None``: in a field of its own (:data:`START_PREFIX`), written once."""
    took_ms: int | None = None
    """``ended_ms - dispatched_ms`` (``None``: not ended)."""
    outcome: _OutcomeCode | None = None
    output: bytes | None = None
    """``None``: JSON ``null``."""
    error: str | None = None
    worker: str | None = None


class _Step(msgspec.Struct, gc=False, array_like=True):
    """A :class:`~saga.core.model.StepState` as stored (an array, written by :func:`_trimmed`)."""

    status: _StatusCode = 0
    """Pending (:data:`STEP_STATUSES`)."""
    attempts: list[_Attempt] = msgspec.field(default_factory=list)
    output: bytes | int | None = None
    """The output, (an int) the index of the attempt whose output it is, or ``None``: JSON ``null``."""
    timer: str | int | None = None
    """The timer, or (an int, :data:`_TIMERS`) which of the last attempt's it is."""
    generation: int = 0
    group: GroupState | None = None
    seq: int = 0
    rewait: int = 0


def _defaults(struct: type[msgspec.Struct]) -> tuple[object, ...]:
    return tuple(
        f.default_factory() if f.default_factory is not msgspec.NODEFAULT else f.default
        for f in msgspec.structs.fields(struct)
    )


_ATTEMPT_DEFAULTS: Final = _defaults(_Attempt)
_STEP_DEFAULTS: Final = _defaults(_Step)


def _trimmed(values: list[object], defaults: tuple[object, ...]) -> list[object]:
    """A record's fields as written: without the trailing ones at their defaults.

    msgspec writes every field of an array; reading a shorter array gives the missing
    trailing fields their defaults, so a pending record is an empty array, a dispatched one
    its status and its attempts' numbers and kinds.
    """
    end = len(values)
    while end and values[end - 1] == defaults[end - 1]:
        end -= 1
    del values[end:]
    return values


_TIMERS: Final = ("timeout", "retry")
"""The purposes of the timers derivable from a step's last attempt
(:func:`~saga.core.timer_ids.attempt_timer_id`), stored as their index + 1."""


class _Meta(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """The ``meta`` field: what a saga holds besides its steps (the key says the rest)."""

    format: int = msgspec.field(name="v")
    cursor: int = msgspec.field(default=0, name="c")
    completed: list[str] = msgspec.field(default_factory=list, name="d")
    cancel: Note | None = msgspec.field(default=None, name="x")
    error: Note | None = msgspec.field(default=None, name="e")
    wait: Wait | None = msgspec.field(default=None, name="w")
    expired: Note | None = msgspec.field(default=None, name="X")
    signals: dict[str, bytes] = msgspec.field(default_factory=dict, name="s")
    parent: ParentLink | None = msgspec.field(default=None, name="p")


_meta_decoder = msgspec.msgpack.Decoder(_Meta)
_step_decoder = msgspec.msgpack.Decoder(_Step)
_start_decoder = msgspec.msgpack.Decoder(_Start)


def encode_step(saga_id: str, key: str, step: StepState) -> bytes:
    """One branch's (or step's, under ``key``) record as stored, its attempts' starts inside."""
    return _encode_step(saga_id, key, step, None)


def _encode_step(saga_id: str, key: str, step: StepState, starts: list[_Start] | None) -> bytes:
    """The record; with ``starts``, each attempt's start goes there instead of inside it."""
    if step == _PENDING:  # every step of a saga that just started but its first
        return _PENDING_RECORD
    attempts: list[list[object]] = []
    for a in step.attempts:
        start = _Start(
            "" if a.command_id == _command_id(saga_id, f"{key}:{a.kind}:{a.n}") else a.command_id,
            a.participant,
            a.input_type,
            bytes(a.input),
            a.dispatched_ms,
        )
        if starts is not None:
            starts.append(start)
        stored: list[object] = [
            a.n,
            _KIND_CODES[a.kind],
            None if starts is not None else start,
            None if a.ended_ms is None else a.ended_ms - a.dispatched_ms,
            None if a.outcome is None else _OUTCOME_CODES[a.outcome],
            _json_value(a.output),
            a.error,
            a.worker,
        ]
        attempts.append(_trimmed(stored, _ATTEMPT_DEFAULTS))
    output: bytes | int | None = _json_value(step.output)
    if output is not None:
        for i, attempt in enumerate(step.attempts):
            if attempt.output == step.output:
                output = i
                break
    timer: str | int | None = step.timer
    if step.timer is not None and step.attempts:
        last = step.attempts[-1]
        for i, purpose in enumerate(_TIMERS, 1):
            if step.timer == attempt_timer_id(saga_id, key, last.kind, last.n, purpose):
                timer = i
    record: list[object] = [
        _STATUS_CODES[step.status],
        attempts,
        output,
        timer,
        step.generation,
        step.group,
        step.seq,
        step.rewait,
    ]
    return _pack.encode(_trimmed(record, _STEP_DEFAULTS))


def _json_value(value: msgspec.Raw) -> bytes | None:
    """A JSON value as stored: its bytes, or ``None`` for ``null``."""
    data = bytes(value)
    return None if data == b"null" else data


_PENDING: Final = StepState()
_PENDING_RECORD: Final = _pack.encode([])  # every field at its default


def decode_step(saga_id: str, key: str, raw: bytes, fields: Mapping[str, bytes] | None = None) -> StepState:
    """A step's (or branch's) record as read (raises ``msgspec.DecodeError`` if corrupt).

    ``fields`` (the saga hash's) hold the starts of the attempts whose record left them out.
    """
    stored = _step_decoder.decode(raw)
    attempts = []
    for i, a in enumerate(stored.attempts):
        start = a.start
        if start is None:
            field = f"{START_PREFIX}{key}:{i}"
            encoded = fields.get(field) if fields is not None else None
            if encoded is None:
                raise msgspec.DecodeError(f"step {key!r} has no {field!r}")
            start = _start_decoder.decode(encoded)
        kind = KINDS[a.kind]
        attempts.append(
            Attempt(
                n=a.n,
                kind=kind,
                command_id=start.command_id or _command_id(saga_id, f"{key}:{kind}:{a.n}"),
                participant=start.participant,
                input_type=start.input_type,
                input=msgspec.Raw(start.input),
                dispatched_ms=start.dispatched_ms,
                ended_ms=None if a.took_ms is None else start.dispatched_ms + a.took_ms,
                outcome=None if a.outcome is None else OUTCOMES[a.outcome],
                output=_raw(a.output),
                error=a.error,
                worker=a.worker,
            )
        )
    output = stored.output
    if isinstance(output, int):
        if not 0 <= output < len(attempts):
            raise msgspec.DecodeError(f"step {key!r} names attempt {output} of {len(attempts)} as its output")
        value = attempts[output].output
    else:
        value = _raw(output)
    return StepState(
        status=STEP_STATUSES[stored.status],
        attempts=attempts,
        output=value,
        timer=_timer(saga_id, key, stored),
        generation=stored.generation,
        group=stored.group,
        seq=stored.seq,
        rewait=stored.rewait,
    )


def decode_timer(saga_id: str, key: str, raw: bytes) -> str | None:
    """A step record's timer alone (no attempt's start needed)."""
    return _timer(saga_id, key, _step_decoder.decode(raw))


def _timer(saga_id: str, key: str, stored: _Step) -> str | None:
    timer = stored.timer
    if not isinstance(timer, int):
        return timer
    if not stored.attempts or not 0 < timer <= len(_TIMERS):
        raise msgspec.DecodeError(f"step {key!r} names timer {timer} of its last attempt")
    last = stored.attempts[-1]
    return attempt_timer_id(saga_id, key, KINDS[last.kind], last.n, _TIMERS[timer - 1])


def _raw(value: bytes | None) -> msgspec.Raw:
    """A stored JSON value; ``null`` as the model's default object, which is left out when encoded."""
    return NULL if value is None else msgspec.Raw(value)


def decode_meta(raw: bytes) -> _Meta:
    """The ``meta`` field as read (raises ``msgspec.DecodeError`` if corrupt or of another format)."""
    meta = _meta_decoder.decode(raw)
    if meta.format != FORMAT:
        raise msgspec.DecodeError(f"saga hash format {meta.format}, not {FORMAT}")
    return meta


@dataclass(slots=True)
class Loaded:
    """A saga as read from Redis: the decoded state, the raw fields it came from, its tag."""

    state: SagaState
    fields: dict[str, bytes]
    tag: str = ""


def new_tag() -> str:
    """A fresh random tag for a new revision (see the ``tag`` field above)."""
    return os.urandom(6).hex()


def expected(loaded: Loaded | None) -> str:
    """What a script checks a saga against: ``<revision>:<tag>`` (``0:``: must not exist)."""
    return f"{loaded.state.revision}:{loaded.tag}" if loaded else "0:"


def encode_state(
    state: SagaState, before: SagaState | None = None, before_fields: Mapping[str, bytes] | None = None
) -> dict[str, bytes]:
    """Encode a state as hash fields (``rev`` excepted: the script owns it).

    ``before_fields`` are ``before`` encoded: a step record equal to ``before``'s is taken
    from them rather than encoded again (a decision changes one or two of a saga's steps).
    """
    fields = {
        "status": state.status.value.encode(),
        "name": state.name.encode(),
        "version": str(state.version).encode(),
        "created": str(state.created_ms).encode(),
        "updated": str(state.updated_ms).encode(),
        "data": bytes(state.data),
        "meta": _pack.encode(
            _Meta(
                format=FORMAT,
                cursor=state.cursor,
                completed=state.completed,
                cancel=state.cancel,
                error=state.error,
                wait=state.wait,
                expired=state.expired,
                signals={key: bytes(value) for key, value in state.signals.items()},
                parent=state.parent,
            )
        ),
    }
    old_steps = before.steps if before is not None else {}
    old_fields = before_fields or {}
    for name, step in state.steps.items():
        field = STEP_PREFIX + name
        encoded = old_fields.get(field)
        if encoded is not None and old_steps.get(name) == step:
            fields[field] = encoded
            for i in range(len(step.attempts)):
                start_field = f"{START_PREFIX}{name}:{i}"
                fields[start_field] = old_fields[start_field]
            continue
        starts: list[_Start] = []
        fields[field] = _encode_step(state.id, name, step, starts)
        for i, start in enumerate(starts):
            fields[f"{START_PREFIX}{name}:{i}"] = _pack.encode(start)
    if state.trace:
        fields["trace"] = state.trace.encode()
        if state.trace_state:
            fields["tstate"] = state.trace_state.encode()
    return fields


def decode_state(saga_id: str, raw: Mapping[bytes, bytes], *, context: str, partition: int) -> Loaded:
    """Decode ``HGETALL`` output of the saga hash in ``context``'s ``partition`` into a state.

    Raises ``msgspec.DecodeError`` if the hash is corrupt or of another :data:`FORMAT`.
    """
    fields = {key.decode(): value for key, value in raw.items()}
    meta = decode_meta(fields["meta"])
    steps = {
        key[len(STEP_PREFIX) :]: decode_step(saga_id, key[len(STEP_PREFIX) :], value, fields)
        for key, value in fields.items()
        if key.startswith(STEP_PREFIX)
    }
    state = SagaState(
        id=saga_id,
        name=fields["name"].decode(),
        version=int(fields["version"]),
        context=context,
        partition=partition,
        status=SagaStatus(fields["status"].decode()),
        data=msgspec.Raw(fields["data"]),
        steps=steps,
        cursor=meta.cursor,
        completed=meta.completed,
        cancel=meta.cancel,
        error=meta.error,
        wait=meta.wait,
        expired=meta.expired,
        signals={key: msgspec.Raw(value) for key, value in meta.signals.items()},
        parent=meta.parent,
        revision=int(fields.get("rev", b"0")),
        created_ms=int(fields["created"]),
        updated_ms=int(fields["updated"]),
        trace=fields.get("trace", b"").decode(),
        trace_state=fields.get("tstate", b"").decode(),
    )
    fields.pop("rev", None)
    tag = fields.pop("tag", b"").decode()
    return Loaded(state, fields, tag)


def changed_branches(
    before: SagaState | None, after: SagaState, touched: Iterable[str] | None = None
) -> dict[str, bytes]:
    """The branch records ``after`` changed since ``before``, encoded (hash field -> record).

    The decider copies a branch record before changing it, so an unchanged record is the
    very object ``before`` holds: no branch is re-encoded unless its decision touched it.
    ``touched`` (the decision's copied records) spares looking at the others.
    """
    previous = before.branches if before is not None else {}
    keys = after.branches if touched is None else [k for k in touched if k in after.branches]
    return {
        key: encode_step(after.id, key, after.branches[key])
        for key in keys
        if previous.get(key) is not after.branches[key]
    }


@dataclass(frozen=True, slots=True)
class StateWrite:
    """What one decision writes to a saga's hash and branch records (:func:`state_write`)."""

    fields: dict[str, bytes]
    """The hash's fields after the decision (``before``'s own dict when nothing changed)."""
    changed: dict[str, bytes]
    """The fields that differ from before."""
    branches: dict[str, bytes]
    """The branch records the decision changed (hash field -> record)."""
    revision: int
    """The saga's revision after the decision."""


def state_write(
    before: SagaState | None,
    before_fields: dict[str, bytes] | None,
    after: SagaState,
    *,
    changed: bool,
    touched: Iterable[str] | None = None,
) -> StateWrite:
    """What a decision that leaves ``after`` writes, and the revision it gives the saga.

    The one revision rule, shared by the store's commit, the in-process runner and replay:
    the revision moves by one when a field of the hash or a branch record changes, and not
    for a decision that changed nothing (``changed`` false: a duplicate, an ignored event).
    ``before_fields`` are ``before`` encoded, when the caller holds them (else encoded here).
    """
    revision = before.revision if before is not None else 0
    old = before_fields if before_fields is not None else encode_state(before) if before is not None else {}
    if not changed:
        return StateWrite(old, {}, {}, revision)
    fields = encode_state(after, before, old)
    diff = {name: value for name, value in fields.items() if old.get(name) != value}
    branches = changed_branches(before, after, touched)
    return StateWrite(fields, diff, branches, revision + 1 if diff or branches else revision)


def migrated_revision(before: SagaState) -> int:
    """The revision a migration gives the saga: always a new one (``migrate.lua``).

    A migration changes the saga's version, so unlike :func:`state_write`'s decisions it
    never leaves the hash as it was; the store, the migrator and the runner share this rule.
    """
    return before.revision + 1
