"""A step's (or a group branch's) record as stored, and back. Pure: no Redis call here.

The saga hash (:mod:`saga.store.codec`) holds one record per step (``s:<step>``) and, for
each attempt, what its dispatch set in a field of its own (``i:<step>:<index>``, written
once); a branch record, in the branch hash (``saga/store/branches.py``), holds its attempts'
starts inside. All are MessagePack arrays in their Structs' field order below, the trailing
fields at their defaults left out (a pending record is an empty array).

Left out as well, and put back on reading: an attempt's command id when it is the derived
one (:func:`~saga.core.command_ids.command_id`, what the decider makes); a step's
output when it is one of its attempts' (its index instead); its timer when it is its last
attempt's timeout, retry or rate timer, which the decider names ``<saga id>:<key>:<kind>:<n>:<purpose>``
(1, 2 or 3 instead). A step's status, an attempt's kind and outcome are small integers
(:data:`STEP_STATUSES`, :data:`KINDS`, :data:`OUTCOMES`); the inputs and outputs stay the
JSON the messages carried, a ``null`` as ``nil``. The saga hash's ``meta`` names the format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Final

import msgspec
from msgspec.structs import asdict, astuple

from saga.core.command_ids import command_id
from saga.core.model import NULL, Attempt, GroupState, Kind, Outcome, StepState
from saga.core.states import StepStatus
from saga.core.timer_ids import attempt_timer_id

START_PREFIX: Final = "i:"
"""Of the field ``i:<step>:<index>``: the start of the step's attempt at that index."""

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


class _Start(msgspec.Struct, gc=False, array_like=True):
    """What an attempt's dispatch sets and nothing later changes (an array)."""

    command_id: str
    """``""``: the id derived from the saga, the record's key, the kind and ``n``."""
    participant: str
    input_type: str
    input: bytes
    dispatched_ms: int


class _Attempt(msgspec.Struct, gc=False, array_like=True):
    """An :class:`~saga.core.model.Attempt` as stored (an array, written by :func:`_stored_attempt`)."""

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


class _Group(GroupState, array_like=True):
    """A :class:`~saga.core.model.GroupState` as stored: its fields in order, an array."""


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
    group: _Group | None = None
    seq: int = 0
    rewait: int = 0


def _defaults(struct: type[msgspec.Struct]) -> tuple[object, ...]:
    return tuple(
        f.default_factory() if f.default_factory is not msgspec.NODEFAULT else f.default
        for f in msgspec.structs.fields(struct)
    )


_GROUP_DEFAULTS: Final = _defaults(_Group)
_STEP_DEFAULTS: Final = _defaults(_Step)


def _trimmed(values: list[object], defaults: tuple[object, ...]) -> list[object]:
    """A record's fields as written: without the trailing ones at their defaults.

    msgspec writes every field of an array; reading a shorter array gives the missing
    trailing fields their defaults, so a pending record is an empty array, a dispatched one
    its status and its attempts' numbers and kinds. The common shapes are cut by hand
    (:func:`_stored_attempt`, :func:`_encode_step`), which costs fewer instructions.
    """
    end = len(values)
    while end and values[end - 1] == defaults[end - 1]:
        end -= 1
    del values[end:]
    return values


_TIMERS: Final = ("timeout", "retry", "rate", "slot")
"""The purposes of the timers derivable from a step's last attempt
(:func:`~saga.core.timer_ids.attempt_timer_id`), stored as their index + 1 (append only)."""


_step_decoder = msgspec.msgpack.Decoder(_Step)
_start_decoder = msgspec.msgpack.Decoder(_Start)


def encode_step(saga_id: str, key: str, step: StepState) -> bytes:
    """One branch's (or step's, under ``key``) record as stored, its attempts' starts inside."""
    return _encode_step(saga_id, key, step, None)


def encode_split(saga_id: str, key: str, step: StepState) -> tuple[bytes, list[bytes]]:
    """A step's record as the saga hash stores it, and its attempts' starts (in order) apart."""
    starts: list[_Start] = []
    record = _encode_step(saga_id, key, step, starts)
    return record, [_pack.encode(start) for start in starts]


def _stored_attempt(a: Attempt, start: _Start | None) -> list[object]:
    """An attempt as its record holds it, ``start`` inside unless ``None``, trimmed (:func:`_trimmed`)."""
    if a.ended_ms is None and a.outcome is None and a.error is None and a.worker is None and a.output == NULL:
        return [a.n, _KIND_CODES[a.kind]] if start is None else [a.n, _KIND_CODES[a.kind], start]  # sent
    stored: list[object] = [
        a.n,
        _KIND_CODES[a.kind],
        start,
        None if a.ended_ms is None else a.ended_ms - a.dispatched_ms,
        None if a.outcome is None else _OUTCOME_CODES[a.outcome],
        None if a.output == NULL else bytes(a.output),
        a.error,
        a.worker,
    ]
    while stored[-1] is None:  # every field after the kind defaults to None
        del stored[-1]
    return stored


def _encode_step(saga_id: str, key: str, step: StepState, starts: list[_Start] | None) -> bytes:
    """The record; with ``starts``, each attempt's start goes there instead of inside it."""
    if step == _PENDING:  # every step of a saga that just started but its first
        return _PENDING_RECORD
    attempts: list[list[object]] = []
    for a in step.attempts:
        start = _Start(
            "" if a.command_id == command_id(saga_id, key, a.kind, a.n) else a.command_id,
            a.participant,
            a.input_type,
            bytes(a.input),
            a.dispatched_ms,
        )
        if starts is not None:
            starts.append(start)
        attempts.append(_stored_attempt(a, None if starts is not None else start))
    output: bytes | int | None = None if step.output == NULL else bytes(step.output)
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
                break
    status = _STATUS_CODES[step.status]
    if step.group is None and not (step.generation or step.seq or step.rewait):  # the most records
        if timer is not None:
            return _pack.encode([status, attempts, output, timer])
        return _pack.encode([status, attempts, output] if output is not None else [status, attempts])
    record: list[object] = [
        status,
        attempts,
        output,
        timer,
        step.generation,
        None if step.group is None else _trimmed(list(astuple(step.group)), _GROUP_DEFAULTS),
        step.seq,
        step.rewait,
    ]
    return _pack.encode(_trimmed(record, _STEP_DEFAULTS))


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
                command_id=start.command_id or command_id(saga_id, key, kind, a.n),
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
        group=None if stored.group is None else GroupState(**asdict(stored.group)),
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
