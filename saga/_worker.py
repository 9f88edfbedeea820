"""The saga worker: one process running an app's orchestrators, timers and participants."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from bus import Bus, Clock, SystemClock, Worker
from saga._app import App
from saga._config import EngineConfig
from saga._model import SagaState
from saga._orchestrator import Orchestrator
from saga._scheduler import Scheduler, run_schedules
from saga._timers import fire_round, run_scheduler


class SagaWorker:
    """Runs everything an :class:`App` declares on one bus worker, plus timers and schedules.

    Bounded concurrency, leases, dead letters, graceful shutdown and reconnects come from
    the bus worker; :meth:`stop` stops both.
    """

    def __init__(
        self,
        redis: Any,
        app: App,
        *,
        config: EngineConfig | None = None,
        clock: Clock | None = None,
        consumer: str | None = None,
    ) -> None:
        self.app = app
        self.config = config or EngineConfig()
        self.clock = clock or SystemClock()
        self.redis = redis
        self.orchestrators = [
            Orchestrator(redis, app.registry, context, clock=self.clock, config=self.config)
            for context in app.registry.contexts.values()
        ]
        self.schedulers = [
            Scheduler(redis, app.registry, context, clock=self.clock, config=self.config)
            for context in app.registry.contexts.values()
        ]
        bus = Bus(app.name)
        for orchestrator in self.orchestrators:
            orchestrator.install(bus)
        for participant in app.participants:
            participant.install(bus)
        self.bus_worker = Worker(
            redis, bus, *app.buses, config=self.config.bus, clock=self.clock, consumer=consumer
        )
        self._stopping = anyio.Event()

    def observe(self, observer: Callable[[SagaState], None]) -> None:
        """Call ``observer`` with the new state after every committed transition."""
        for orchestrator in self.orchestrators:
            orchestrator.observers.append(observer)

    @property
    def partitions(self) -> list[Any]:
        """Every partition whose sagas this worker orchestrates."""
        return [p for o in self.orchestrators for p in o.partitions]

    @property
    def started(self) -> anyio.Event:
        """Set once the bus worker reads."""
        return self.bus_worker.started

    def stop(self) -> None:
        """Stop gracefully: in-flight handlers finish, the rest stays pending for others."""
        self._stopping.set()
        self.bus_worker.stop()

    async def run(self) -> None:
        """Run the app's ``on_start`` hooks, then everything until :meth:`stop`, then ``on_stop``."""
        for hook in self.app.on_start:
            await hook()
        try:
            async with anyio.create_task_group() as tg:
                if self.orchestrators:
                    tg.start_soon(run_scheduler, self.redis, self.partitions, self.clock, self.config)
                    tg.start_soon(run_schedules, self.schedulers, self.clock, self.config)
                await self.bus_worker.run()
                tg.cancel_scope.cancel()
        finally:
            for hook in self.app.on_stop:
                await hook()

    async def run_until_idle(self, *, max_rounds: int = 10_000) -> None:
        """Handle everything due now (entries, timers, schedules), then return: for tests and demos."""
        for _ in range(max_rounds):
            fired = (await fire_round(self.redis, self.partitions, self.clock, self.config.timer_batch)).fired
            for scheduler in self.schedulers:
                fired += await scheduler.tick()
            await self.bus_worker.run_until_idle()
            if not fired:
                return
        raise RuntimeError(f"still busy after {max_rounds} rounds")
