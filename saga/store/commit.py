"""The one-script commit of a transition, and the entries it writes.

The saga hash's fields are encoded by :mod:`saga.store.codec`.

An event wait's registration (``WatchEvent``/``UnwatchEvent``) is a command on the
partition's ``cmd:_waits`` stream, written by the same script: the context-wide index it
updates lives in another slot (see ``saga/store/wait_index.py``).

Every change goes through ``saga/store/lua/transition.lua`` (documented at its top): revision
check, lease check on the inbox entry, state, history, indexes, timers, commands and ack,
in one atomic script.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from bus import Delivery, Envelope, derived_id
from bus.lowlevel import ScriptCall
from bus.tracing import trace_headers
from saga.core.decider import Decision
from saga.core.effects import (
    CancelTimer,
    Dispatch,
    Effect,
    NotifyParent,
    StartTimer,
    UnwatchEvent,
    WatchEvent,
    idempotency_key,
)
from saga.core.history_entry import HistoryEntry
from saga.core.model import Event, Kind, ParentLink, SagaState, TimerFired, TimerPurpose
from saga.core.states import SETTLED
from saga.definition.waits import WAITS
from saga.store.codec import Loaded, expected, new_tag, state_write
from saga.store.history import encode_entry
from saga.store.keys import Partition
from saga.store.scripts import TRANSITION
from saga.store.trust import INCARNATION, Seal, orchestrator_of, participant_named

TIMER_FIRED: Final = "TimerFired"
"""The inbox entry type of a fired timer (written by ``saga/store/lua/fire_timers.lua``)."""

_json = msgspec.json.Encoder()


class WatchRequest(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """The payload of a ``WatchEvent``/``UnwatchEvent`` command on ``cmd:_waits``."""

    saga_id: str
    partition: int
    step: str
    n: int
    stream: str
    message_type: str
    key: str
    attempt: int = 0
    """The waiting attempt, when it is not ``n`` (see :class:`~saga.core.effects.WatchEvent`)."""

    @classmethod
    def of(cls, saga_id: str, partition: int, effect: WatchEvent | UnwatchEvent) -> WatchRequest:
        """The request an effect of saga ``saga_id`` (in ``partition``) makes."""
        return cls(
            saga_id=saga_id,
            partition=partition,
            step=effect.step,
            n=effect.n,
            stream=effect.stream,
            message_type=effect.message_type,
            key=effect.key,
            attempt=effect.attempt,
        )


class TimerTemplate(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True, array_like=True):
    """A timer's event as stored: a :class:`~saga.core.model.TimerFired` minus id and time.

    Stored in ``timerdata`` under the timer id as ``<byte length of the saga id>:<saga id>``
    followed by this Struct as a JSON array (``["timeout","charge","do",1,<created>,<due>]``),
    without the timer id (the hash field and the fired entry's id carry it). The layouts
    before it (a JSON object; the first one with the timer id inside and the saga id in a
    ``<timer id>:c`` field; the array without the last two items) are still read.

    It is the fired entry's payload, so the orchestrator's MAC covers the saga's incarnation
    and the due time: a fired timer replayed into a later saga under the same id, or added
    to the inbox before it is due, is refused (:func:`saga.store.trust.check_fresh`).
    """

    purpose: TimerPurpose
    step: str
    kind: Kind
    attempt: int
    created_ms: int = 0
    """The saga's incarnation (its creation time); 0 in timers set before it was recorded."""
    due_ms: int = 0
    """When the timer is due by the clock of the orchestrator that set it (0: not recorded)."""

    @classmethod
    def of(cls, timer: StartTimer, *, created_ms: int, now_ms: int) -> TimerTemplate:
        """The stored form of a timer a decision at ``now_ms`` started (saga created at ``created_ms``)."""
        due = timer.at_ms if timer.at_ms is not None else now_ms + timer.delay_ms
        return cls(
            purpose=timer.purpose,
            step=timer.step,
            kind=timer.kind,
            attempt=timer.attempt,
            created_ms=created_ms,
            due_ms=due,
        )

    @staticmethod
    def decode(data: bytes) -> TimerTemplate:
        """Decode a stored (or fired) event: the array, or the object an older layout wrote."""
        if data[:1] != b"{":
            return _template_decoder.decode(data)
        old = _template_object_decoder.decode(data)
        return TimerTemplate(purpose=old.purpose, step=old.step, kind=old.kind, attempt=old.attempt)

    def stored(self, saga_id: str, auth: bytes = b"") -> bytes:
        """The ``timerdata`` value: the saga id, length-prefixed, then the event.

        The timer id is not in it: the hash field carries it. With
        signing on, ``auth`` (``b'<k> <mac>'``, :meth:`saga.store.trust.Seal.fields` of
        :meth:`entry`) goes between them, length-prefixed too, and the script that fires
        the timer writes it as the entry's ``k`` and ``mac``, with ``p`` the
        context's orchestrator (the only principal that signs timers), which it is given.
        """
        owner = saga_id.encode()
        signed = b"" if not auth else str(len(auth)).encode() + b":" + auth
        return str(len(owner)).encode() + b":" + owner + signed + _json.encode(self)

    def entry(self, timer_id: str, saga_id: str) -> Envelope:
        """The inbox entry ``saga/store/lua/fire_timers.lua`` writes when the timer fires (to sign it)."""
        return Envelope(id=timer_id, type=TIMER_FIRED, payload=_json.encode(self), correlation_id=saga_id)

    @classmethod
    def parse(cls, stored: bytes) -> tuple[str, TimerTemplate]:
        """Read a ``timerdata`` value back: ``(saga id, event)`` (the inverse of :meth:`stored`)."""
        length, _, rest = stored.partition(b":")
        if not length.isdigit():  # the first layout: the bare event, saga id in another field
            return "", cls.decode(stored)
        size = int(length)
        owner, rest = rest[:size].decode(), rest[size:]
        if rest[:1] not in (b"[", b"{"):  # signed: '<len>:<k mac>' before the event
            auth_length, _, rest = rest.partition(b":")
            rest = rest[int(auth_length) :]
        return owner, cls.decode(rest)

    def fired(self, event_id: str, at_ms: int) -> TimerFired:
        """The event the saga sees when this timer fires (the entry's id is the timer id)."""
        return TimerFired(
            id=event_id,
            at_ms=at_ms,
            timer_id=event_id,
            purpose=self.purpose,
            step=self.step,
            kind=self.kind,
            attempt=self.attempt,
        )


def stamps_of(envelope: Envelope) -> tuple[int, int]:
    """The saga incarnation and due time an inbox entry carries under its MAC (0: none).

    A fired timer's are in its payload (:class:`TimerTemplate`); a reply's incarnation is the
    header its command carried (:data:`~saga.store.trust.INCARNATION`).
    """
    if envelope.type == TIMER_FIRED:
        timer = TimerTemplate.decode(envelope.payload)
        return timer.created_ms, timer.due_ms
    sent = envelope.headers.get(INCARNATION, "")
    return (int(sent) if sent.isdigit() else 0), 0


class _TimerObject(msgspec.Struct, gc=False, kw_only=True):
    """The event as the layouts before the array stored it: a JSON object.

    The first layout had the timer id inside too, which the fired entry's id repeats.
    """

    purpose: TimerPurpose
    step: str
    kind: Kind
    attempt: int


_template_decoder = msgspec.json.Decoder(TimerTemplate)
_template_object_decoder = msgspec.json.Decoder(_TimerObject)


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What the transition script said."""

    outcome: Literal["ok", "conflict", "lost", "drained"]
    revision: int = 0


def command_envelope(
    state: SagaState, dispatch: Dispatch, partition: Partition, *, cause: str, now_ms: int
) -> Envelope:
    """The envelope of a dispatched command: keyed for dedupe, addressed back to the inbox.

    Its headers name the saga's definition, the step, the kind and the saga's incarnation
    (:data:`~saga.store.trust.INCARNATION`), and carry the saga's trace context when it was
    traced; its reply carries them back, under the participant's MAC.
    """
    headers = {
        "saga": f"{state.name}@{state.version}",
        "step": dispatch.step,
        "kind": dispatch.kind,
        INCARNATION: str(state.created_ms),
    }
    if state.trace:
        headers.update(trace_headers(state.trace, state.trace_state))
    return Envelope(
        id=dispatch.command_id,
        type=dispatch.message_type,
        payload=bytes(dispatch.payload),
        source=state.context,
        correlation_id=state.id,
        causation_id=cause,
        idempotency_key=idempotency_key(
            state.id,
            dispatch.step,
            dispatch.kind,
            (state.steps.get(dispatch.step) or state.branches[dispatch.step]).generation,
        ),
        reply_to=partition.inbox.key,
        created_at_ms=now_ms,
        attempt=dispatch.attempt,
        headers=headers,
    )


def commit_call(
    partition: Partition,
    before: Loaded | None,
    decision: Decision,
    event: Event,
    *,
    delivery: Delivery | None,
    now_ms: int,
    timer_now_ms: int,
    retention_s: int,
    seal: Seal | None = None,
) -> tuple[ScriptCall, Loaded]:
    """Build the transition script call for ``decision``; also return the saga as it will be.

    The returned :class:`Loaded` is what a cache may keep once the call says ``ok`` (with
    the revision it returns). The argument layout is documented in ``lua/transition.lua``.
    With a ``seal`` every command, timer and report the transition writes is signed by the
    context's orchestrator for whoever reads it.
    """
    state = decision.state
    old_status: str = before.state.status if before else ""  # a StrEnum: .value costs a lookup
    tag = before.tag if before else ""
    write = state_write(
        before.state if before else None,
        before.fields if before else {},
        state,
        changed=decision.changed,
        touched=decision.touched,
    )
    new_fields, branches, revision = write.fields, write.branches, write.revision
    changed: list[Any] = [part for item in write.changed.items() for part in item]
    if write.revision != (before.state.revision if before else 0):
        tag = new_tag()
        changed += ("tag", tag.encode())
    entry = HistoryEntry(
        event=event,
        effects=decision.effects,
        status=state.status,
        revision=revision,
        ignored=decision.ignored,
    )
    timers, cancels, streams, commands = _effect_args(
        partition, state, decision.effects, cause=getattr(event, "id", ""), now_ms=now_ms, seal=seal
    )
    terminal = state.status.terminal
    announced = state.status != old_status and state.status in SETTLED
    keys = _touched_keys(
        partition,
        state.id,
        (old_status, state.status),
        new=before is None,
        inbox=delivery is not None,
        timers=bool(timers or cancels),
        changed=bool(changed),
        ends=terminal,
        expires=retention_s > 0,
        announced=announced,
    )
    keys += streams
    args = [
        expected(before),
        timer_now_ms,
        delivery.group if delivery else "",
        delivery.consumer if delivery else "",
        delivery.entry_id if delivery else "",
        retention_s,
        int(terminal) + 2 * bool(state.branches) + 4 * announced,
        encode_entry(entry, state),
        len(changed) // 2,
        *changed,
        len(timers) // 3,
        *timers,
        len(cancels),
        *cancels,
        len(streams),
        *commands,
    ]
    if state.branches:  # the branch hash: last key, last section (saga/store/branches.py)
        keys.append(partition.branches(state.id))
        args.append(len(branches))
        for item in branches.items():
            args += item
    return ScriptCall(TRANSITION, tuple(keys), tuple(args)), Loaded(state, new_fields, tag)


def _touched_keys(
    partition: Partition,
    saga_id: str,
    statuses: tuple[str, str],
    *,
    new: bool,
    inbox: bool,
    timers: bool,
    changed: bool,
    ends: bool,
    expires: bool,
    announced: bool,
) -> list[str]:
    """The keys a transition touches, but its command streams, in the script's order.

    ``statuses`` are the saga's before (``''``: new) and after. ``transition.lua`` derives
    which keys it needs from its arguments by the same rules and refuses, before it writes,
    a call with another number of keys, so a key left out here is one it never touches.
    """
    old, status = statuses
    inbox_key, timers_key, timer_data, counts, drained, ending = _fixed_keys(partition)
    keys = [partition.saga(saga_id), partition.history(saga_id)]
    if inbox:
        keys.append(inbox_key)
    if timers:
        keys += (timers_key, timer_data)
    moved = status != old
    if moved:
        keys.append(counts)
        if old:
            keys.append(partition.by_status(old))
    if moved or (changed and not ends):
        keys.append(partition.by_status(status))
    if new:
        keys.append(drained)
    if ends and expires:
        keys.append(ending)
    if announced:  # the saga just ended or was dead-lettered: SagaClient.wait is told
        keys.append(partition.ends)
    return keys


@functools.lru_cache(maxsize=1024)
def _fixed_keys(partition: Partition) -> tuple[str, str, str, str, str, str]:
    """The keys of ``partition`` a transition may touch besides its saga's, indexes and streams."""
    return (
        partition.inbox.key,
        partition.timers,
        partition.timer_data,
        partition.counts,
        partition.drained,
        partition.ending,
    )


def _effect_args(
    partition: Partition,
    state: SagaState,
    effects: list[Effect],
    *,
    cause: str,
    now_ms: int,
    seal: Seal | None,
) -> tuple[list[Any], list[str], list[str], list[Any]]:
    """The effects as the transition's sections: timers to start, timers to cancel, messages.

    Messages come as their stream keys (one each) and, in the same order, their fields.
    """
    timers: list[Any] = []
    cancels: list[str] = []
    streams: list[str] = []
    messages: list[Any] = []
    me = orchestrator_of(state.context)
    signing = seal is not None and seal.enabled
    for effect in effects:
        audience = me
        if isinstance(effect, Dispatch):
            envelope = command_envelope(state, effect, partition, cause=cause, now_ms=now_ms)
            streams.append(partition.commands(effect.participant).key)
            if not effect.participant.startswith("_"):  # _local, _waits, _child: the orchestrator's own
                audience = participant_named(effect.participant)
        elif isinstance(effect, StartTimer):
            due = f"@{effect.at_ms}" if effect.at_ms is not None else effect.delay_ms
            template = TimerTemplate.of(effect, created_ms=state.created_ms, now_ms=now_ms)
            auth = seal.fields(template.entry(effect.timer_id, state.id), me) if signing and seal else b""
            timers += (effect.timer_id, due, template.stored(state.id, auth))
            continue
        elif isinstance(effect, CancelTimer):
            cancels.append(effect.timer_id)
            continue
        elif isinstance(effect, WatchEvent | UnwatchEvent):
            envelope = watch_envelope(state, effect, now_ms=now_ms)
            streams.append(partition.commands(WAITS).key)
        elif isinstance(effect, NotifyParent) and state.parent is not None:
            envelope = parent_envelope(state, effect, now_ms=now_ms)
            streams.append(partition.inbox.key)
        else:
            continue
        if signing and seal:
            envelope = seal.sign(envelope, audience)
        fields = envelope.field_args()
        messages += (len(fields) // 2, *fields)
    return timers, cancels, streams, messages


PARENT_REPORT: Final = "ParentReport"
"""The inbox entry type of a child's end report: the child's own inbox, read by its
orchestrator, which forwards it to the parent's inbox (another slot)."""


class ParentReport(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """The payload of a child saga's end report (see :data:`PARENT_REPORT`)."""

    child: str
    saga: str
    """The child's definition, ``name@version``."""
    parent: ParentLink
    status: str
    ok: bool
    output: msgspec.Raw = msgspec.Raw(b"null")
    error: str = ""


def parent_envelope(state: SagaState, effect: NotifyParent, *, now_ms: int) -> Envelope:
    """The inbox entry that reports a child saga's end, to be forwarded to its parent."""
    assert state.parent is not None  # noqa: S101 - only child sagas notify
    report = ParentReport(
        child=state.id,
        saga=f"{state.name}@{state.version}",
        parent=state.parent,
        status=effect.status,
        ok=effect.ok,
        output=effect.output,
        error=effect.error,
    )
    return Envelope(
        id=derived_id(state.id, "ended"),
        type=PARENT_REPORT,
        payload=_json.encode(report),
        source=state.context,
        correlation_id=state.id,
        created_at_ms=now_ms,
        headers=trace_headers(state.trace, state.trace_state),
    )


def watch_envelope(state: SagaState, effect: WatchEvent | UnwatchEvent, *, now_ms: int) -> Envelope:
    """The ``cmd:_waits`` command that (un)registers an event wait in the context's index."""
    kind = "WatchEvent" if isinstance(effect, WatchEvent) else "UnwatchEvent"
    which = f"{effect.n}.{effect.attempt}" if effect.attempt else str(effect.n)
    return Envelope(
        id=derived_id(state.id, f"{effect.step}:{kind}:{which}"),
        type=kind,
        payload=_json.encode(WatchRequest.of(state.id, state.partition, effect)),
        source=state.context,
        correlation_id=state.id,
        created_at_ms=now_ms,
        headers=trace_headers(state.trace, state.trace_state),
    )


def commit_result(reply: Any) -> CommitResult:
    """Decode the transition script's reply."""
    outcome = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    if outcome in ("lost", "drained"):
        return CommitResult("lost" if outcome == "lost" else "drained")
    return CommitResult("ok" if outcome == "ok" else "conflict", int(reply[1]))
