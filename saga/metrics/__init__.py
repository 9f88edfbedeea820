"""Prometheus metrics, ``/healthz`` and ``/readyz`` for saga workers.

This is an adapter beside the runtime, not part of the engine: it installs hooks on a
:class:`~saga.SagaWorker` (its orchestrators' committed transitions, its timer rounds, its
bus worker's consumers) and reads Redis at scrape time; nothing in the engine imports it.
``saga worker --metrics-port PORT`` serves it; services that embed a worker use
:class:`WorkerMetrics` with their own registry. Every metric is listed in :data:`METRICS`
(names, types, labels, help), which ``docs/operations.md`` and the Grafana dashboard are
checked against.
"""

from bus.metrics import BUS_METRICS, MetricSpec, MetricsServer
from saga.metrics._collector import SAGA_METRICS, SagaMetrics
from saga.metrics._rates import RATE_METRICS
from saga.metrics._slots import SLOT_METRICS
from saga.metrics._worker import DEFAULT_STUCK_FOR_MS, WorkerMetrics

METRICS = (*SAGA_METRICS, *RATE_METRICS, *SLOT_METRICS, *BUS_METRICS)
"""Every metric a worker may export: the sagas' first, the rate limits', then the bus's."""

__all__ = [
    "DEFAULT_STUCK_FOR_MS",
    "METRICS",
    "MetricSpec",
    "MetricsServer",
    "SagaMetrics",
    "WorkerMetrics",
]
