"""The bus's Prometheus figures and the small HTTP server that exposes them.

What an engine built on the bus (``saga.metrics``, ``relay.metrics``) or a service embedding a
worker needs to export metrics: the specs of the bus's metrics (:data:`BUS_METRICS`), the
collector that counts a worker's deliveries and reads its streams' figures from Redis at
scrape time (:class:`BusMetrics`, on :class:`ScrapeCollector`), the readiness checks behind
``/readyz`` (:func:`readiness`), latency buckets counted as plain ints (:class:`Buckets`),
what a metrics port serves (:class:`Exporter`: collectors on a registry, and readiness) and
the ``/metrics``, ``/healthz``, ``/readyz`` server (:class:`MetricsServer`).
"""

from bus._exporter import Exporter
from bus._http import DEFAULT_HOST, MetricsServer
from bus._metrics import (
    BUILD_INFO,
    BUS_METRICS,
    REDIS,
    BusMetrics,
    Figures,
    MetricSpec,
    ScrapeCollector,
    build_labels,
    readiness,
)
from bus._tally import Buckets

__all__ = [
    "BUILD_INFO",
    "BUS_METRICS",
    "DEFAULT_HOST",
    "REDIS",
    "Buckets",
    "BusMetrics",
    "Exporter",
    "Figures",
    "MetricSpec",
    "MetricsServer",
    "ScrapeCollector",
    "build_labels",
    "readiness",
]
