"""What a metrics port serves: scrape collectors on one registry, and a readiness check.

A saga worker's metrics (``saga.metrics.WorkerMetrics``) and a relay's
(``relay.metrics.RelayMetrics``) are both an :class:`Exporter`: they differ in their
collectors and in what makes them ready, not in how a scrape refreshes the figures, renders
the registry or is served on ``/metrics``, ``/healthz`` and ``/readyz``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from prometheus_client import CollectorRegistry, generate_latest

from bus._http import DEFAULT_HOST, MetricsServer
from bus._metrics import ScrapeCollector


class Exporter(ABC):
    """Collectors registered on ``registry`` (a fresh one unless given), and :meth:`ready`.

    A service that already serves ``/metrics`` passes its registry
    (``prometheus_client.REGISTRY`` for the default one): the collectors join it. Their
    figures are refreshed on the event loop they were made on: a ``/metrics`` served from
    another thread (``prometheus_client.start_http_server``) refreshes them by itself; an
    async handler on that loop awaits :meth:`refresh` before it renders the registry, or uses
    :meth:`exposition`.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._collectors: list[ScrapeCollector] = []

    def add(self, collector: ScrapeCollector) -> None:
        """Register ``collector`` on the registry."""
        self.registry.register(collector)
        self._collectors.append(collector)

    async def refresh(self) -> bool:
        """Read every figure now; return whether every collector could read its source."""
        up = True
        for collector in self._collectors:
            up = await collector.refresh() and up
        return up

    async def exposition(self) -> bytes:
        """One scrape of the registry, in the Prometheus text format."""
        await self.refresh()
        return generate_latest(self.registry)

    @abstractmethod
    async def ready(self) -> list[str]:
        """Why the process is not ready (empty: ready); what ``/readyz`` reports."""

    def server(self, *, host: str = DEFAULT_HOST, port: int = 0) -> MetricsServer:
        """A server of ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port``."""
        return MetricsServer(self.exposition, self.ready, host=host, port=port)

    def close(self) -> None:
        """Unregister the collectors (whatever hooks they installed stay, and keep counting)."""
        for collector in self._collectors:
            self.registry.unregister(collector)
        self._collectors.clear()
