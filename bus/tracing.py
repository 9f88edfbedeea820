"""OpenTelemetry tracing for the bus and the engines built on it (``bus/_tracing.py``).

Tracing needs ``pip install 'redsaga[tracing]'`` and a tracer provider; without them every
function here is a no-op that returns at once. The trace context travels in the envelope's
headers (``traceparent``, ``tracestate``), covered by the envelope's MAC.
"""

from bus._tracing import (
    SYSTEM,
    TRACEPARENT,
    TRACESTATE,
    carried,
    consumer_span,
    current_headers,
    current_span,
    fail,
    messaging,
    producer_span,
    record_span,
    trace_headers,
    tracer,
    use_tracer_provider,
    with_current,
)

__all__ = [
    "SYSTEM",
    "TRACEPARENT",
    "TRACESTATE",
    "carried",
    "consumer_span",
    "current_headers",
    "current_span",
    "fail",
    "messaging",
    "producer_span",
    "record_span",
    "trace_headers",
    "tracer",
    "use_tracer_provider",
    "with_current",
]
