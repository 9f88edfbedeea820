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

``meta`` is a MessagePack map with one-letter names and no default written; the context and
partition are the key's. The step records and the starts are MessagePack arrays
(:mod:`saga.store.records` says what they leave out).

The records of a group step's branches live in a hash of their own, written by the same
script (``saga/store/branches.py``), so the saga hash stays small however many branches run.

The commit of a transition (:mod:`saga.store.commit`) writes these fields; replay
(:mod:`saga.core.replay`) encodes the states it rebuilds the same way, to predict the
revisions the store wrote.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from saga.core.model import Note, ParentLink, SagaState, StepState, Wait
from saga.core.states import SagaStatus
from saga.store.records import START_PREFIX, decode_step, encode_split, encode_step

STEP_PREFIX: Final = "s:"
FORMAT: Final = 4
"""The layout of ``meta`` and the step records, written in ``meta`` (1: JSON, with the
context and partition in ``meta`` and every command id written out; 2: MessagePack, meta a
map with short names and step records arrays, nothing the key or a derivation says; 3: an
attempt's start in a field of its own, ``i:<step>:<i>``, and a derivable timer left out; 4:
statuses, kinds and outcomes as their codes, a JSON ``null`` as ``nil``, trailing defaults
left out)."""

_pack = msgspec.msgpack.Encoder()


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
    stamped: bool = msgspec.field(default=False, name="t")


_meta_decoder = msgspec.msgpack.Decoder(_Meta)


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


def encode_state(state: SagaState) -> dict[str, bytes]:
    """Encode a state as hash fields (``rev`` excepted: the script owns it).

    The status, name and version come first, in that order: ``transition.lua`` finds a
    changed status, and a new saga's definition, at the head of the fields that changed.
    A decision's write encodes only what it changed (:func:`state_write`).
    """
    fields = {
        "status": state.status.encode(),  # a StrEnum: its own text
        "name": state.name.encode(),
        "version": str(state.version).encode(),
        "created": str(state.created_ms).encode(),
        "updated": str(state.updated_ms).encode(),
        "data": bytes(state.data),
        "meta": _encode_meta(state),
    }
    for name, step in state.steps.items():
        _put_step(fields, state.id, name, step)
    if state.trace:
        fields["trace"] = state.trace.encode()
        if state.trace_state:
            fields["tstate"] = state.trace_state.encode()
    return fields


def _encode_meta(state: SagaState) -> bytes:
    """The ``meta`` field of ``state``."""
    return _pack.encode(
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
            stamped=state.stamped,
        )
    )


def _put_step(fields: dict[str, bytes], saga_id: str, name: str, step: StepState) -> None:
    """Put step ``name``'s record and its attempts' starts into ``fields``."""
    fields[STEP_PREFIX + name], starts = encode_split(saga_id, name, step)
    for i, start in enumerate(starts):
        fields[f"{START_PREFIX}{name}:{i}"] = start


def _rewritten(
    before: SagaState, old: dict[str, bytes], after: SagaState
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The fields after a decision from ``before`` (encoded as ``old``) to ``after``, and those that changed.

    What :func:`encode_state` and a comparison of every field give, for the price of
    encoding only what the decision may have changed.

    The caller checks that the fields a decision never changes (the definition, the creation
    time, the trace) are ``before``'s. A step record the decision did not copy
    (``saga.core.model.SagaState.working_copy`` shares them) is left as ``old`` holds it.
    """
    fresh: dict[str, bytes] = {"status": after.status.encode()}  # first, where the script looks
    if after.updated_ms != before.updated_ms:
        fresh["updated"] = str(after.updated_ms).encode()
    if after.data is not before.data:
        fresh["data"] = bytes(after.data)
    fresh["meta"] = _encode_meta(after)
    old_steps = before.steps
    for name, step in after.steps.items():
        previous = old_steps.get(name)
        if (previous is step or previous == step) and STEP_PREFIX + name in old:
            continue
        _put_step(fresh, after.id, name, step)
    changed = {name: value for name, value in fresh.items() if old.get(name) != value}
    return {**old, **changed}, changed


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
        stamped=meta.stamped,
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
    if before is not None and _same_run(before, after):
        fields, diff = _rewritten(before, old, after)
    else:
        fields = encode_state(after)
        diff = {name: value for name, value in fields.items() if old.get(name) != value}
    branches = changed_branches(before, after, touched)
    return StateWrite(fields, diff, branches, revision + 1 if diff or branches else revision)


def _same_run(before: SagaState, after: SagaState) -> bool:
    """Whether ``after`` keeps what no decision changes: the definition, creation time and trace."""
    return (
        after.name == before.name
        and after.version == before.version
        and after.created_ms == before.created_ms
        and after.trace == before.trace
        and after.trace_state == before.trace_state
    )


def migrated_revision(before: SagaState) -> int:
    """The revision a migration gives the saga: always a new one (``migrate.lua``).

    A migration changes the saga's version, so unlike :func:`state_write`'s decisions it
    never leaves the hash as it was; the store, the migrator and the runner share this rule.
    """
    return before.revision + 1
