"""The metrics and health of a :class:`~saga.SagaWorker`, for its own port or a host's registry."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, generate_latest

from bus.metrics import DEFAULT_HOST, BusMetrics, MetricsServer, ScrapeCollector, readiness
from saga.metrics._collector import SagaMetrics
from saga.runtime.worker import SagaWorker

DEFAULT_STUCK_FOR_MS: Final = 10 * 60_000
"""What ``redsaga_sagas_stuck`` counts by default: no move for 10 minutes (as ``saga stats``)."""


class WorkerMetrics:
    """Prometheus metrics of one worker, registered on ``registry``, and its readiness.

    ``saga worker --metrics-port`` serves them with :meth:`server`. A service that embeds a
    :class:`~saga.SagaWorker` and already serves ``/metrics`` passes its registry
    (``prometheus_client.REGISTRY`` for the default one): redsaga's collectors join it.
    Their figures are refreshed on the worker's event loop: a ``/metrics`` served from
    another thread (``prometheus_client.start_http_server``) refreshes them by itself; an
    async handler on the worker's loop awaits :meth:`refresh` before it renders the registry,
    or uses :meth:`exposition`.

    Create it before the worker runs, on the worker's loop (it installs hooks on the
    worker). ``stuck_for_ms``: how long a saga must not have moved to count as stuck.
    ``timeout_s``: how long one scrape may read Redis.
    """

    def __init__(
        self,
        worker: SagaWorker,
        *,
        registry: CollectorRegistry | None = None,
        stuck_for_ms: int = DEFAULT_STUCK_FOR_MS,
        timeout_s: float = 5.0,
    ) -> None:
        self.worker = worker
        self.registry = registry if registry is not None else CollectorRegistry()
        orchestrates = bool(worker.orchestrators)
        self.bus = BusMetrics(worker.bus_worker, dead_letters=orchestrates, timeout_s=timeout_s)
        """The bus's figures (deliveries, slots, round trips, pending, lag, dead letters)."""
        self.sagas: SagaMetrics | None = None
        """The sagas' figures (``None`` for a worker that runs participants only)."""
        self._collectors: list[ScrapeCollector] = [self.bus]
        if orchestrates:
            self.sagas = SagaMetrics(
                worker.redis, worker.partitions, worker.clock, stuck_for_ms=stuck_for_ms, timeout_s=timeout_s
            )
            for orchestrator in worker.orchestrators:
                orchestrator.transitions.append(self.sagas.tallies.transition)
            worker.timer_observers.append(self.sagas.tallies.timers)
            self._collectors.append(self.sagas)
        for collector in self._collectors:
            self.registry.register(collector)

    async def refresh(self) -> bool:
        """Read every figure now (Redis included); return whether Redis could be read."""
        up = True
        for collector in self._collectors:
            up = await collector.refresh() and up
        return up

    async def exposition(self) -> bytes:
        """One scrape of the registry, in the Prometheus text format."""
        await self.refresh()
        return generate_latest(self.registry)

    async def ready(self) -> list[str]:
        """Why the worker is not ready (empty: ready); ``/readyz`` (``bus/_metrics.py``)."""
        return await readiness(self.worker.bus_worker)

    def server(self, *, host: str = DEFAULT_HOST, port: int = 0) -> MetricsServer:
        """A server of ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port``."""
        return MetricsServer(self.exposition, self.ready, host=host, port=port)

    def close(self) -> None:
        """Unregister the collectors (the worker's hooks stay, and keep counting)."""
        for collector in self._collectors:
            self.registry.unregister(collector)
