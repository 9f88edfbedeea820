"""OpenTelemetry tracing: the W3C trace context in envelope headers, and the bus's spans.

The trace context travels in an entry's headers (``hdr``) as the W3C ``traceparent`` and
``tracestate`` fields, so the envelope's MAC covers it like every other header
(``bus/_auth.py``). Carrying it needs no package: :func:`carried` checks and copies the
two strings, so a process without OpenTelemetry (or without a tracer provider) passes a
saga's trace on unchanged.

Spans need ``opentelemetry-api`` (the ``tracing`` extra) and a tracer provider: the global
one (``opentelemetry.trace.set_tracer_provider``) or one given to
:func:`use_tracer_provider`. Without either, :func:`tracer` is ``None`` and every helper here
returns at once: no span, no context switch, no header written.

What the bus traces (names and attributes follow OpenTelemetry's messaging conventions):
each handler runs inside a ``process <stream>`` span of kind ``CONSUMER`` whose parent is
the entry's trace context, so a handler's own spans nest in it; and :meth:`bus.Publisher.publish`
puts the current span's context in the headers of what it publishes. A malformed
``traceparent`` is ignored (the entry is handled, with no parent) and logged once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from bus._log import get_logger

try:
    from opentelemetry import trace as _trace
    from opentelemetry.context import Context
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the tests run with the SDK installed; a subprocess checks this
    _trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from bus._delivery import Delivery

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
SYSTEM: Final = "redis"
"""``messaging.system``: Redis Streams (a custom value, as the conventions allow)."""
_TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE_MAX: Final = 512
"""W3C lets a vendor drop a ``tracestate`` over 512 characters; so do we."""
_log = get_logger("redsaga.bus")
_LAZY_PROVIDER: Final = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
"""Whether OpenTelemetry loads its global provider from the environment on first use."""
_state: dict[str, Any] = {"provider": None, "tracer": None, "tracer_of": None, "warned": False}
Handler = Callable[[Any, "Delivery"], Awaitable[object | None]]


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace with ``provider`` instead of OpenTelemetry's global one (``None``: the global again).

    For tests and for services that keep redsaga's spans apart; most set the global provider.
    """
    _state["provider"] = provider
    _state["tracer"] = _state["tracer_of"] = None  # worked out again on the next call


def tracer() -> Tracer | None:
    """The tracer of redsaga's spans, or ``None`` when there is nothing to trace with (fast)."""
    if _trace is None:
        return None
    provider = _state["provider"] or _global_provider()
    if provider is _state["tracer_of"]:
        return _state["tracer"]  # type: ignore[no-any-return]
    found = None
    if provider is not None and not isinstance(provider, ProxyTracerProvider | NoOpTracerProvider):
        found = provider.get_tracer("redsaga")
    _state["tracer"], _state["tracer_of"] = found, provider
    return found


def _global_provider() -> Any:
    """OpenTelemetry's global provider (``None`` while unset), read without its per-call cost.

    ``get_tracer_provider()`` looks ``OTEL_PYTHON_TRACER_PROVIDER`` up in ``os.environ`` on every
    call until a provider is set (3 µs, the whole cost of tracing off on every handler);
    the module attribute it returns is read directly, and the API's function is used only
    when that variable names a provider or a later API lacks the attribute.
    """
    found = getattr(_trace, "_TRACER_PROVIDER", _trace)
    if found is None and not _LAZY_PROVIDER:
        return None
    return _trace.get_tracer_provider() if found is None or found is _trace else found


def carried(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """The ``(traceparent, tracestate)`` in ``headers``, or ``None`` if there is none.

    A malformed ``traceparent`` counts as none: the first one this process meets is logged
    (a warning), the others silently, so a misbehaving sender cannot flood the log.
    """
    parent = headers.get(TRACEPARENT)
    if parent is None:
        return None
    if not _TRACEPARENT.fullmatch(parent):
        if not _state["warned"]:
            _state["warned"] = True
            _log.warning("malformed traceparent ignored (logged once per process)", traceparent=parent[:64])
        return None
    state = headers.get(TRACESTATE, "")
    return parent, state if len(state) <= _TRACESTATE_MAX else ""


def trace_headers(parent: str, state: str = "") -> dict[str, str]:
    """The headers that carry the trace context ``(parent, state)`` (none for ``""``)."""
    if not parent:
        return {}
    return {TRACEPARENT: parent, TRACESTATE: state} if state else {TRACEPARENT: parent}


def current_headers() -> dict[str, str]:
    """The current span's trace context as headers (none when nothing is traced)."""
    if tracer() is None:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def with_current(headers: dict[str, str] | None) -> dict[str, str] | None:
    """``headers`` plus the current span's trace context, unless they carry one already."""
    if tracer() is None or (headers and TRACEPARENT in headers):
        return headers
    current = current_headers()
    return {**headers, **current} if headers else current or headers


def parent_context(headers: Mapping[str, str]) -> Any:
    """The OpenTelemetry context whose span is the one ``headers`` name (an empty context if none).

    Only call it with a tracer (:func:`tracer` not ``None``).
    """
    found = carried(headers)
    if found is None:
        return Context()  # a root span, not a child of whatever the caller's task holds
    return TraceContextTextMapPropagator().extract(dict(zip((TRACEPARENT, TRACESTATE), found, strict=True)))


@contextmanager
def consumer_span(
    name: str, headers: Mapping[str, str], attributes: Mapping[str, Any]
) -> Iterator[Span | None]:
    """A current ``CONSUMER`` span named ``name``, child of the context ``headers`` carry.

    Yields ``None`` (and does nothing) when nothing is traced. An exception leaving the block
    is recorded on the span and sets its status to error.
    """
    found = tracer()
    if found is None:
        yield None
        return
    with found.start_as_current_span(
        name, context=parent_context(headers), kind=SpanKind.CONSUMER, attributes=dict(attributes)
    ) as span:
        yield span


@contextmanager
def producer_span(
    name: str, attributes: Mapping[str, Any], *, parent: Mapping[str, str] | None = None
) -> Iterator[Span | None]:
    """A current ``PRODUCER`` span: a child of ``parent`` (headers) if given, else of the current span."""
    found = tracer()
    if found is None:
        yield None
        return
    context = None if parent is None else parent_context(parent)
    with found.start_as_current_span(
        name, context=context, kind=SpanKind.PRODUCER, attributes=dict(attributes)
    ) as span:
        yield span


def record_span(
    name: str, headers: Mapping[str, str], attributes: Mapping[str, Any], *, start_ns: int, error: str = ""
) -> None:
    """Record a finished ``CONSUMER`` span from ``start_ns`` to now, child of the context ``headers`` carry.

    For work measured after the fact (an orchestrator's batched decisions). ``error`` sets the
    span's error status. Does nothing when nothing is traced.
    """
    found = tracer()
    if found is None:
        return
    span = found.start_span(
        name,
        context=parent_context(headers),
        kind=SpanKind.CONSUMER,
        attributes=dict(attributes),
        start_time=start_ns,
    )
    if error:
        fail(span, error)
    span.end()


def current_span() -> Span | None:
    """The current span if it is recording (``None`` when nothing is traced)."""
    if tracer() is None:
        return None
    span = _trace.get_current_span()
    return span if span.is_recording() else None


def fail(span: Span, description: str) -> None:
    """Mark ``span`` as failed (error status) with ``description``."""
    span.set_status(Status(StatusCode.ERROR, description[:256]))


def messaging(delivery: Delivery) -> dict[str, Any]:
    """The messaging conventions' attributes of a handler's span for ``delivery``."""
    envelope = delivery.envelope
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": delivery.stream.key,
        "messaging.consumer.group.name": delivery.group,
        "messaging.client.id": delivery.consumer,
        "messaging.message.id": envelope.id,
    }
    if envelope.correlation_id:
        attributes["messaging.message.conversation_id"] = envelope.correlation_id
    if delivery.deliveries > 1:
        attributes["messaging.redis.delivery_count"] = delivery.deliveries
    return attributes


def traced(handler: Handler) -> Handler:
    """``handler`` run inside a ``process <stream>`` span when tracing is on (as is, else)."""

    async def run(message: Any, delivery: Delivery) -> object | None:
        if tracer() is None:
            return await handler(message, delivery)
        envelope = delivery.envelope
        with consumer_span(f"process {delivery.stream.key}", envelope.headers, messaging(delivery)):
            return await handler(message, delivery)

    run.__qualname__ = getattr(handler, "__qualname__", "handler")
    return run
