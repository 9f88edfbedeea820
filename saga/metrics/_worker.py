"""The metrics and health of a :class:`~saga.SagaWorker`, for its own port or a host's registry."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry

from bus.metrics import BusMetrics, Exporter, readiness
from saga.metrics._collector import SagaMetrics
from saga.metrics._rates import RateMetrics
from saga.metrics._slots import SlotMetrics
from saga.runtime.worker import SagaWorker

DEFAULT_STUCK_FOR_MS: Final = 10 * 60_000
"""What ``redsaga_sagas_stuck`` counts by default: no move for 10 minutes (as ``saga stats``)."""


class WorkerMetrics(Exporter):
    """Prometheus metrics of one worker, registered on ``registry``, and its readiness.

    ``saga worker --metrics-port`` serves them with :meth:`server`. A service that embeds a
    :class:`~saga.SagaWorker` and already serves ``/metrics`` passes its registry
    (``prometheus_client.REGISTRY`` for the default one): redsaga's collectors join it
    (:class:`bus.metrics.Exporter` says how their figures are refreshed).

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
        super().__init__(registry)
        self.worker = worker
        orchestrates = bool(worker.orchestrators)
        self.bus = BusMetrics(worker.bus_worker, dead_letters=orchestrates, timeout_s=timeout_s)
        """The bus's figures (deliveries, slots, round trips, pending, lag, dead letters)."""
        self.sagas: SagaMetrics | None = None
        """The sagas' figures (``None`` for a worker that runs participants only)."""
        self.add(self.bus)
        if orchestrates:
            self.sagas = SagaMetrics(
                worker.redis,
                worker.partitions,
                worker.clock,
                stuck_for_ms=stuck_for_ms,
                participants=worker.versions.participants,
                timeout_s=timeout_s,
            )
            for orchestrator in worker.orchestrators:
                orchestrator.transitions.append(self.sagas.tallies.transition)
            worker.timer_observers.append(self.sagas.tallies.timers)
            self.add(self.sagas)
        if orchestrates and worker.app.limits:
            tallies = [orchestrator.gates.rates.tallies for orchestrator in worker.orchestrators]
            self.add(RateMetrics(worker.redis, tallies, list(worker.app.limits), timeout_s=timeout_s))
        keys: dict[str, set[str]] = {}
        for orchestrator in worker.orchestrators:
            for definition in worker.app.registry:
                if (
                    definition.concurrency is not None
                    and definition.context.name == orchestrator.context.name
                ):
                    keys.setdefault(orchestrator.context.name, set()).add(definition.concurrency.name)
        if keys:
            slots = [orchestrator.gates.slots.tallies for orchestrator in worker.orchestrators]
            self.add(SlotMetrics(worker.redis, slots, keys, timeout_s=timeout_s))

    async def ready(self) -> list[str]:
        """Why the worker is not ready (empty: ready); ``/readyz`` (``bus/_metrics.py``)."""
        return await readiness(self.worker.bus_worker)
