"""What travels on a partition's inbox, and how an inbox entry becomes a decider event.

Replies are the participant's output message itself (its type is the step's ``reply``
type), or :class:`StepFailed`; a reply is matched to its attempt by the command id it names
as its cause and by the ``step``/``kind`` headers the command carried. Timer firings,
operator requests, signals and matched events are the engine's own message types.
"""

from __future__ import annotations

from typing import Final

import msgspec

from bus import Envelope, MalformedEntry
from saga.core.model import (
    NULL,
    CancelRequested,
    Event,
    EventReceived,
    ForceCompleted,
    Kind,
    ParentLink,
    RedriveRequested,
    RetryRequested,
    SignalReceived,
    Started,
    StepReplied,
)
from saga.store.commit import TIMER_FIRED as TIMER
from saga.store.commit import TimerTemplate


class StepFailed(msgspec.Struct, gc=False, tag="StepFailed", kw_only=True):
    """A participant's (or an action's) failure reply."""

    error: str
    error_type: str = ""
    permanent: bool = False


class StepSucceeded(msgspec.Struct, gc=False, tag="StepSucceeded", kw_only=True):
    """A success reply that carries its output wrapped (actions, and ``None`` outputs)."""

    output: msgspec.Raw = NULL


class OperatorRequest(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """The payload of cancel, retry, force-complete and redrive requests sent to the inbox.

    ``revision`` is the saga revision the request was judged against (0: no check); the
    decider ignores the request if the saga has moved since.
    """

    by: str = ""
    reason: str = ""
    step: str = ""
    output: msgspec.Raw = NULL
    revision: int = 0


class SignalDelivery(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """The payload of a ``SignalReceived`` inbox entry: the resume token, and the signal's data.

    ``step`` and ``n`` repeat what the token names (the orchestrator checks the token, and
    that they agree, before the saga sees the signal).
    """

    step: str
    n: int
    data: msgspec.Raw = NULL
    by: str = ""
    token: str = ""

    def received(self, event_id: str, at_ms: int) -> SignalReceived:
        """The decider's event for this delivery."""
        return SignalReceived(id=event_id, at_ms=at_ms, step=self.step, n=self.n, data=self.data, by=self.by)


class StartRequest(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """The payload of a ``StartRequested`` inbox entry: a client's request to start a saga.

    The entry's correlation id is the new saga's id; ``saga`` names its definition
    (``name@version``) and ``data`` is its start data, already checked against the type.
    """

    saga: str
    data: msgspec.Raw
    by: str = ""
    parent: ParentLink | None = None

    def started(self, event_id: str, at_ms: int) -> Started:
        """The decider's event for this request (the orchestrator fills in ``steps``)."""
        return Started(
            id=event_id, at_ms=at_ms, data=self.data, by=self.by, saga=self.saga, parent=self.parent
        )


class EventDelivery(msgspec.Struct, gc=False, kw_only=True):
    """The payload of an ``EventReceived`` inbox entry: which wait, and the matched event."""

    step: str
    n: int
    event_id: str
    message_type: str
    payload: msgspec.Raw

    def received(self, event_id: str, at_ms: int) -> EventReceived:
        """The decider's event for this delivery."""
        return EventReceived(
            id=event_id,
            at_ms=at_ms,
            step=self.step,
            n=self.n,
            event_id=self.event_id,
            message_type=self.message_type,
            payload=self.payload,
        )


START: Final = "StartRequested"
CANCEL: Final = "CancelRequested"
RETRY: Final = "RetryRequested"
FORCE: Final = "ForceCompleted"
REDRIVE: Final = "RedriveRequested"
FAILED: Final = "StepFailed"
SUCCEEDED: Final = "StepSucceeded"
SIGNAL: Final = "SignalReceived"
EVENT: Final = "EventReceived"

_operator = msgspec.json.Decoder(OperatorRequest)
_failed = msgspec.json.Decoder(StepFailed)
_succeeded = msgspec.json.Decoder(StepSucceeded)
_signal = msgspec.json.Decoder(SignalDelivery)
_start = msgspec.json.Decoder(StartRequest)
_event = msgspec.json.Decoder(EventDelivery)


def signal_token(envelope: Envelope) -> str:
    """The resume token a ``SignalReceived`` entry carries (``""`` if none)."""
    return _signal.decode(envelope.payload).token


def to_event(envelope: Envelope) -> Event:
    """Turn an inbox envelope into a decider event; :class:`MalformedEntry` says why not."""
    try:
        return _decode(envelope)
    except (msgspec.DecodeError, ValueError, RecursionError) as error:  # deep nesting: RecursionError
        raise MalformedEntry(f"inbox entry of type {envelope.type!r} is invalid: {error}") from error


def _decode(envelope: Envelope) -> Event:
    at = envelope.created_at_ms
    if envelope.type == TIMER:
        return TimerTemplate.decode(envelope.payload).fired(envelope.id, at)
    if envelope.type == SIGNAL:
        return _signal.decode(envelope.payload).received(envelope.id, at)
    if envelope.type == EVENT:
        return _event.decode(envelope.payload).received(envelope.id, at)
    if envelope.type == START:
        return _start.decode(envelope.payload).started(envelope.id, at)
    if envelope.type in (CANCEL, RETRY, FORCE, REDRIVE):
        return operator_event(envelope.type, envelope.id, at, _operator.decode(envelope.payload))
    return _reply_event(envelope)


def _reply_event(envelope: Envelope) -> Event:
    at = envelope.created_at_ms
    step, kind = envelope.headers.get("step"), envelope.headers.get("kind")
    if not step or kind not in ("do", "undo", "confirm") or not envelope.causation_id:
        raise ValueError(f"a reply needs step and kind headers and a causation id (type {envelope.type!r})")
    command_id = envelope.causation_id
    worker = envelope.headers.get("replied-by", envelope.source)
    step_kind: Kind = "do" if kind == "do" else "undo" if kind == "undo" else "confirm"
    if envelope.type == FAILED:
        failure = _failed.decode(envelope.payload)
        return StepReplied(
            id=envelope.id,
            at_ms=at,
            step=step,
            kind=step_kind,
            attempt=envelope.attempt,
            command_id=command_id,
            worker=worker,
            ok=False,
            error=failure.error,
            error_type=failure.error_type or None,
            permanent=failure.permanent,
        )
    output = _succeeded.decode(envelope.payload).output if envelope.type == SUCCEEDED else envelope.payload
    return StepReplied(
        id=envelope.id,
        at_ms=at,
        step=step,
        kind=step_kind,
        attempt=envelope.attempt,
        command_id=command_id,
        worker=worker,
        ok=True,
        output=msgspec.Raw(bytes(output)),
    )


def operator_event(kind: str, event_id: str, at: int, request: OperatorRequest) -> Event:
    """The decider event an operator request of ``kind`` becomes (``ValueError`` if incomplete)."""
    by, reason, revision = request.by, request.reason, request.revision
    if kind == CANCEL:
        return CancelRequested(id=event_id, at_ms=at, by=by, reason=reason, expected_revision=revision)
    if kind == RETRY:
        return RetryRequested(id=event_id, at_ms=at, by=by, reason=reason, expected_revision=revision)
    if not request.step or not reason:
        raise ValueError(f"{kind} needs a step and a reason")
    if kind == REDRIVE:
        return RedriveRequested(
            id=event_id, at_ms=at, step=request.step, by=by, reason=reason, expected_revision=revision
        )
    return ForceCompleted(
        id=event_id,
        at_ms=at,
        step=request.step,
        output=request.output,
        by=by,
        reason=reason,
        expected_revision=revision,
    )
