"""A saga's state as the fields of its Redis hash, and back. Pure: no Redis call here.

A saga hash holds small fields so that a transition rewrites only what changed::

    rev      the revision (optimistic concurrency; written by the script only)
    tag      a random tag written with every revision: a revision lost (AOF tail, failover)
             and made again by another commit differs in its tag, so a cached copy of the
             lost one cannot commit onto the new one
    status   lifecycle status            name, version   the definition it runs
    created  creation time (ms)          updated         last change (ms)
    data     the start data (JSON)       meta            cursor, completed steps, notes,
                                                         the current wait, early signals,
                                                         the parent (child sagas)
    s:<step> one step's state with every attempt (JSON)
    trace    the W3C traceparent of the saga's start, when it was traced (written once)
    tstate   the W3C tracestate that came with it, if any

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

STEP_PREFIX: Final = "s:"

_json = msgspec.json.Encoder()
_step_decoder = msgspec.json.Decoder(StepState)


class _Meta(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    context: str
    partition: int
    cursor: int = 0
    completed: list[str] = msgspec.field(default_factory=list)
    cancel: Note | None = None
    error: Note | None = None
    wait: Wait | None = None
    expired: Note | None = None
    signals: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)
    parent: ParentLink | None = None


_meta_decoder = msgspec.json.Decoder(_Meta)


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
    """Encode a state as hash fields (``rev`` excepted: the script owns it)."""
    fields = {
        "status": state.status.value.encode(),
        "name": state.name.encode(),
        "version": str(state.version).encode(),
        "created": str(state.created_ms).encode(),
        "updated": str(state.updated_ms).encode(),
        "data": bytes(state.data),
        "meta": _json.encode(
            _Meta(
                context=state.context,
                partition=state.partition,
                cursor=state.cursor,
                completed=state.completed,
                cancel=state.cancel,
                error=state.error,
                wait=state.wait,
                expired=state.expired,
                signals=state.signals,
                parent=state.parent,
            )
        ),
    }
    for name, step in state.steps.items():
        fields[STEP_PREFIX + name] = _json.encode(step)
    if state.trace:
        fields["trace"] = state.trace.encode()
        if state.trace_state:
            fields["tstate"] = state.trace_state.encode()
    return fields


def decode_state(saga_id: str, raw: Mapping[bytes, bytes]) -> Loaded:
    """Decode ``HGETALL`` output into a state (raises ``msgspec.DecodeError`` if corrupt)."""
    fields = {key.decode(): value for key, value in raw.items()}
    meta = _meta_decoder.decode(fields["meta"])
    steps = {
        key[len(STEP_PREFIX) :]: _step_decoder.decode(value)
        for key, value in fields.items()
        if key.startswith(STEP_PREFIX)
    }
    state = SagaState(
        id=saga_id,
        name=fields["name"].decode(),
        version=int(fields["version"]),
        context=meta.context,
        partition=meta.partition,
        status=SagaStatus(fields["status"].decode()),
        data=msgspec.Raw(fields["data"]),
        steps=steps,
        cursor=meta.cursor,
        completed=meta.completed,
        cancel=meta.cancel,
        error=meta.error,
        wait=meta.wait,
        expired=meta.expired,
        signals=meta.signals,
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
    """The branch records ``after`` changed since ``before``, encoded (hash field -> JSON).

    The decider copies a branch record before changing it, so an unchanged record is the
    very object ``before`` holds: no branch is re-encoded unless its decision touched it.
    ``touched`` (the decision's copied records) spares looking at the others.
    """
    previous = before.branches if before is not None else {}
    keys = after.branches if touched is None else [k for k in touched if k in after.branches]
    return {
        key: _json.encode(after.branches[key]) for key in keys if previous.get(key) is not after.branches[key]
    }


@dataclass(frozen=True, slots=True)
class StateWrite:
    """What one decision writes to a saga's hash and branch records (:func:`state_write`)."""

    fields: dict[str, bytes]
    """The hash's fields after the decision (``before``'s own dict when nothing changed)."""
    changed: dict[str, bytes]
    """The fields that differ from before."""
    branches: dict[str, bytes]
    """The branch records the decision changed (hash field -> JSON)."""
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
    fields = encode_state(after)
    diff = {name: value for name, value in fields.items() if old.get(name) != value}
    branches = changed_branches(before, after, touched)
    return StateWrite(fields, diff, branches, revision + 1 if diff or branches else revision)


def migrated_revision(before: SagaState) -> int:
    """The revision a migration gives the saga: always a new one (``migrate.lua``).

    A migration changes the saga's version, so unlike :func:`state_write`'s decisions it
    never leaves the hash as it was; the store, the migrator and the runner share this rule.
    """
    return before.revision + 1
