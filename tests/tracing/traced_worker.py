"""``saga worker`` with spans written to a file: ``python -m tests.tracing.traced_worker APP SPANS``.

The process sets OpenTelemetry's global tracer provider (the SDK's, named after the App) with
a console exporter that writes each finished span as one JSON line to ``SPANS``, then runs
the ``saga worker`` command on ``APP`` (``module:attribute``) as a deployment would.
"""

from __future__ import annotations

import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from redsaga.cli.main import main


def one_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


if __name__ == "__main__":
    app, path = sys.argv[1:3]
    out = Path(path).open("a", buffering=1)  # noqa: SIM115 - open until the process exits
    provider = TracerProvider(resource=Resource.create({"service.name": app.rpartition(":")[2]}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=one_line)))
    trace.set_tracer_provider(provider)
    sys.argv = ["saga", "worker", "--app", app]
    main()
