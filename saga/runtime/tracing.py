"""The saga engine's spans: a saga's start, each step attempt and compensation, each transition.

A saga's trace begins where it is started (:func:`start_span`, a ``PRODUCER`` span in
:meth:`saga.SagaClient.start`, child of the caller's current span). The saga keeps that span's
W3C context in its state (:attr:`~saga.core.model.SagaState.trace`) and every command it
sends carries it, whichever worker sends it and however long a timer held it; so each step
attempt's span -- the participant's ``process`` span, named and described here by
:func:`step_span` while the handler runs inside it -- is a child of the start, in one trace
across services. A child saga's start is a child of the parent's ``_child`` command.

Attributes (``redsaga.*``, beside the messaging conventions' ``messaging.*``): saga id,
definition, version, context, step, kind (``do``, ``undo``, ``confirm``), attempt and
outcome (``ok``, ``transient``, ``permanent``); a failed attempt's span has error status.

The orchestrator records each inbox entry it decided and committed (:func:`transition_span`):
``saga decide <definition>``, or ``saga end <definition>`` for the decision that ended the
saga, a child of the entry's trace context (the saga's own when the entry carries none),
with the entry's type, the step it concerns and the saga's status after it; a saga that
ended failed, compensated or cancelled, or was parked for an operator, has error status.
Without a tracer every function here returns at once (``bus/_tracing.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from bus import Envelope, Reply
from bus.tracing import (
    SYSTEM,
    carried,
    current_headers,
    current_span,
    fail,
    producer_span,
    record_span,
    tracer,
)
from saga.core.states import SagaStatus
from saga.runtime.protocol import StepFailed
from saga.runtime.step_reply import reply_for

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from saga.core.decider import Decision
    from saga.core.model import SagaState
    from saga.definition.saga import Saga

UNTRACED: Final = ("", "")
_KINDS: Final = {"do": "step", "undo": "compensate", "confirm": "confirm"}
_BAD_ENDS: Final = frozenset(
    {SagaStatus.FAILED, SagaStatus.COMPENSATED, SagaStatus.CANCELLED, SagaStatus.DEAD_LETTERED}
)


def trace_of(envelope: Envelope) -> tuple[str, str]:
    """The trace context an entry carries, ``(traceparent, tracestate)`` (:data:`UNTRACED` if none)."""
    return carried(envelope.headers) or UNTRACED


def keep_trace(decision: Decision, trace: tuple[str, str]) -> None:
    """Record ``trace`` in a new saga's state (the decision's own, freshly made)."""
    decision.state.trace, decision.state.trace_state = trace


def _attributes(saga_id: str, name: str, version: int, context: str, **more: Any) -> dict[str, Any]:
    """The attributes that name a saga on its spans (and ``more``, as ``redsaga.<key>``)."""
    return {
        "redsaga.saga.id": saga_id,
        "redsaga.definition": name,
        "redsaga.version": version,
        "redsaga.context": context,
        **{f"redsaga.{key}": value for key, value in more.items()},
    }


def _sent(inbox: str, saga_id: str) -> dict[str, Any]:
    """The messaging conventions' attributes of an entry sent to a saga's inbox."""
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": inbox,
        "messaging.message.conversation_id": saga_id,
    }


@contextmanager
def start_span(
    definition: Saga[Any], saga_id: str, inbox: str, inherit: tuple[str, str] | None = None
) -> Iterator[tuple[str, str]]:
    """The start's span (``saga start <definition>``); yields the trace context the saga keeps.

    Without a tracer no span is made and the saga keeps ``inherit`` (a child saga's parent's
    context, so a process that does not trace still passes a trace on), else nothing.
    """
    attributes = {
        **_attributes(saga_id, definition.name, definition.version, definition.context.name),
        **_sent(inbox, saga_id),
    }
    parent = dict(_headers(inherit)) if inherit and inherit[0] and current_span() is None else None
    with producer_span(f"saga start {definition.name}", attributes, parent=parent) as span:
        yield (inherit or UNTRACED) if span is None else carried(current_headers()) or UNTRACED


@contextmanager
def signal_span(state: SagaState, step: str, inbox: str) -> Iterator[tuple[str, str]]:
    """A signal's span (``saga signal <step>``), in the saga's own trace; yields what the signal carries.

    Without a tracer the signal carries the saga's trace context as it is.
    """
    attributes = {
        **_attributes(state.id, state.name, state.version, state.context, step=step),
        **_sent(inbox, state.id),
    }
    saga_trace = (state.trace, state.trace_state)
    parent = dict(_headers(saga_trace)) if state.trace else None
    with producer_span(f"saga signal {step}", attributes, parent=parent) as span:
        yield saga_trace if span is None else carried(current_headers()) or UNTRACED


def _headers(trace: tuple[str, str]) -> Iterator[tuple[str, str]]:
    yield "traceparent", trace[0]
    if trace[1]:
        yield "tracestate", trace[1]


def step_span(envelope: Envelope) -> Span | None:
    """Name and describe the current span as the attempt ``envelope`` commands (``None``: untraced).

    Called in a participant's handler (or a local action), whose ``process`` span the bus made
    current: it becomes ``saga step <step>`` (``saga compensate <step>`` for a compensation).
    """
    span = current_span()
    if span is None:
        return None
    headers = envelope.headers
    name, _, version = headers.get("saga", "").rpartition("@")
    step, kind = headers.get("step", ""), headers.get("kind", "")
    span.update_name(f"saga {_KINDS.get(kind, kind)} {step}")
    span.set_attributes(
        _attributes(
            envelope.correlation_id,
            name,
            int(version) if version.isdigit() else 0,
            envelope.source,
            step=step,
            kind=kind,
            attempt=envelope.attempt,
        )
    )
    return span


def step_outcome(span: Span, reply: Any) -> None:
    """Record the attempt's outcome from the reply its code made (error status on failure)."""
    failure = reply.message if isinstance(reply, Reply) else reply
    if not isinstance(failure, StepFailed):
        span.set_attribute("redsaga.outcome", "ok")
        return
    span.set_attribute("redsaga.outcome", "permanent" if failure.permanent else "transient")
    span.set_attribute("error.type", failure.error_type or "StepFailed")
    fail(span, failure.error)


async def traced_reply(envelope: Envelope, work: Awaitable[Any], *, wrap: bool) -> Any:
    """:func:`~saga.runtime.step_reply.reply_for` in the step's span (:func:`step_span`), with its outcome."""
    span = step_span(envelope)
    reply = await reply_for(work, wrap=wrap)
    if span is not None:
        step_outcome(span, reply)
    return reply


def transition_span(envelope: Envelope, before: SagaState | None, decision: Decision, start_ns: int) -> None:
    """Record the decision of one inbox entry, committed, as a span (see the module docstring)."""
    if tracer() is None:
        return
    state = decision.state
    ended = state.status.terminal and (before is None or not before.status.terminal)
    headers: dict[str, str] | Mapping[str, str] = envelope.headers
    if carried(headers) is None:
        headers = dict(_headers((state.trace, state.trace_state))) if state.trace else {}
    more: dict[str, Any] = {"entry": envelope.type, "status": state.status.value}
    step = envelope.headers.get("step")
    if step:
        more["step"] = step
    if decision.ignored:
        more["ignored"] = decision.ignored
    moved = before is None or before.status is not state.status
    record_span(
        f"saga {'end' if ended else 'decide'} {state.name}",
        headers,
        _attributes(state.id, state.name, state.version, state.context, **more),
        start_ns=start_ns,
        error=f"saga {state.status.value}" if moved and state.status in _BAD_ENDS else "",
    )
