"""The saga worker: one process running an app's orchestrators, timers and participants.

Before anything runs, the worker registers its definitions' shapes in the version
registry, and refuses to start (:class:`~saga.errors.IncompatibleChange`, naming the saga, the
version and each problem) when its code changed a registered version incompatibly while
sagas are in flight on it. While it runs it renews its registration of what it serves and
logs stranded sagas (in flight on versions no live worker serves) as errors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from bus import Bus, BusError, Clock, Publisher, RedisDataLost, SystemClock, Worker
from bus.lowlevel import Backoff, get_logger
from saga.core.model import SagaState
from saga.errors import PartitionMismatch
from saga.runtime.app import App
from saga.runtime.client import SagaClient
from saga.runtime.config import EngineConfig
from saga.runtime.liveness import keep_health_file, remove_health_file
from saga.runtime.orchestrator import Orchestrator
from saga.runtime.saga_cache import SagaCache
from saga.runtime.schedule_runner import Scheduler, run_schedules
from saga.runtime.tasks import TaskEngine, install_tasks, task_contexts
from saga.runtime.timer_firing import Round, fire_round, run_scheduler
from saga.store.pruning import prune_ended
from saga.store.rates import register as register_limits
from saga.store.tasks import RedisTaskStore
from saga.versions.records import Registration, Stranded, worker_info
from saga.versions.registry import Versions

_log = get_logger("redsaga.saga")


class SagaWorker:
    """Runs everything an :class:`App` declares on one bus worker, plus timers and schedules.

    Bounded concurrency, leases, dead letters, graceful shutdown and reconnects come from
    the bus worker; :meth:`stop` stops both. Raises :class:`~saga.errors.PartitionOutOfRange`
    when ``config.partitions`` names indexes none of the app's contexts has, and
    :class:`bus.AuthError` when ``config.auth`` holds no keyring and signing was not turned off
    on purpose (``REDSAGA_VERIFY=off``; :meth:`~saga.EngineConfig.check_signing`).
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
        self.config.check_partitions(app.contexts)
        # Refused here, naming the SagaWorker; running unauthenticated, its bus worker says so.
        self.config.check_signing(f"the SagaWorker of {app.name!r}", redis, warn=False)
        self.clock = clock or SystemClock()
        self.redis = redis
        self.cache = SagaCache(self.config.cache_size)
        """The sagas as this process last wrote them: its orchestrators' and clients' cache."""
        self.orchestrators = [
            Orchestrator(redis, app.registry, context, clock=self.clock, config=self.config, cache=self.cache)
            for context in app.registry.contexts.values()
        ]
        self.schedulers = [
            Scheduler(redis, app.registry, context, clock=self.clock, config=self.config, cache=self.cache)
            for context in app.registry.contexts.values()
        ]
        bus = Bus(app.name)
        for orchestrator in self.orchestrators:
            orchestrator.install(bus)
        for participant in app.participants:
            participant.install(bus, self.config.serves)
        auth = self.config.auth
        self.has_tasks = bool(task_contexts(app.registry))
        principal = auth.signer_for("orchestrator") if self.has_tasks else ""  # a participant holds none
        publisher = Publisher(redis, source=app.name, config=self.config.bus, auth=auth, principal=principal)
        signers = {o.context.name: o.signer for o in self.orchestrators}
        self.tasks = TaskEngine(
            RedisTaskStore(redis), self.clock, publisher, source=app.name, signer=lambda c: signers[c]()
        )
        """The task inbox: the ``tasks`` participant and the firing of task timers."""
        install_tasks(bus, self.tasks, app.registry)
        self.bus_worker = Worker(
            redis,
            bus,
            *app.buses,
            config=self.config.bus,
            clock=self.clock,
            consumer=consumer,
            auth=self.config.auth,
            epoch_writer=bool(self.orchestrators),  # a participant's ACL user only reads rs:epoch
        )
        self._stopping = anyio.Event()
        self.timer_observers: list[Callable[[Round], None]] = []
        """Called with every round of the timer scheduler that fired timers (metrics)."""
        self.versions = Versions(redis, clock=self.clock)
        self._started_ms = self.clock.now_ms()

    def client(self, *, source: str = "client", principal: str | None = None) -> SagaClient:
        """A client for this worker's app that shares the worker's cache.

        Sagas it starts are decided from memory when their first reply arrives, without the
        read a client in another process costs the orchestrator (one ``HGETALL`` per saga).
        """
        return SagaClient(
            self.redis,
            self.app.registry,
            clock=self.clock,
            config=self.config,
            source=source,
            principal=principal,
            cache=self.cache,
        )

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

    async def register(self) -> Registration:
        """Register the app's definition shapes and what this worker serves (idempotent).

        Raises :class:`~saga.errors.IncompatibleChange` when the code changed a registered version's
        shape incompatibly while sagas are in flight on it; nothing is registered then.
        Records the participants it runs, per context, for operators' tools. Raises
        :class:`~saga.errors.PartitionMismatch` when a participant serves a context with
        fewer or more partitions than the context registered, and what
        :meth:`bus.Worker.preflight` raises: :class:`~bus.UnsafeRedisConfig` and
        :class:`~bus.RedisDataLost`.
        """
        await self.bus_worker.preflight()  # before writing anything: Redis settings, and the epoch
        backoff = Backoff(self.clock)
        while True:  # wait out a Redis outage, as the bus worker's set-up does
            try:
                await self._check_partitions()
                return await self._register() if self.orchestrators else Registration()
            except BusError as error:
                if not error.retryable or self._stopping.is_set():
                    raise
                _log.warning("registering definition versions failed; retrying", error=str(error))
                await backoff.wait()

    async def _check_partitions(self) -> None:
        for participant in self.app.participants:
            for context in participant.serves:
                registered = await self.versions.registered_partitions(context.name)
                if registered is not None and registered != context.partitions:
                    raise PartitionMismatch(participant.name, context.name, context.partitions, registered)
                await self.versions.register_participant(
                    context.name, participant.name, by=f"{self.app.name}/{self.bus_worker.consumer}"
                )

    async def _register(self) -> Registration:
        await register_limits(self.redis, list(self.app.limits))
        report = await self.versions.register(
            self.app.registry, by=f"{self.app.name}/{self.bus_worker.consumer}"
        )
        for key in report.added:
            _log.info("definition version registered", definition=key)
        for change in report.changed:
            _log.info("registered shape updated (a safe change)", change=change.line())
        for change in report.replaced:
            _log.warning("registered shape replaced: nothing was in flight on it", change=change.line())
        await self.heartbeat()
        return report

    async def heartbeat(self) -> None:
        """Renew this worker's registration of the definition versions it serves."""
        for context in self.app.registry.contexts:
            serves = [d.key for d in self.app.registry if d.context.name == context]
            info = worker_info(self.bus_worker.consumer, self.app.name, serves, self._started_ms)
            await self.versions.heartbeat(context, info, self.config.registration_ttl_ms)

    async def check_stranded(self) -> list[Stranded]:
        """Stranded sagas of this worker's contexts, each logged as an error."""
        stranded = await self.versions.stranded(self.app.registry.contexts)
        for item in stranded:
            _log.error(
                "stranded sagas: no running worker serves their version",
                definition=f"{item.saga}@{item.version}",
                context=item.context,
                in_flight=item.in_flight,
                detail=item.line(),
            )
        return stranded

    async def prune_ended(self) -> int:
        """Forget ended sagas whose hash expired (index entries, counters); return how many."""
        return await prune_ended(self.redis, self.partitions, self.clock)

    async def run(self) -> None:
        """Register, run the app's ``on_start`` hooks, everything until :meth:`stop`, ``on_stop``."""
        health_file = self.config.health_file
        if health_file:
            await remove_health_file(health_file)
        await self.register()
        for hook in self.app.on_start:
            await hook()
        lost: RedisDataLost | None = None
        try:
            async with anyio.create_task_group() as tg:
                if health_file:
                    tg.start_soon(
                        keep_health_file,
                        self.redis,
                        health_file,
                        self.clock,
                        self.config.heartbeat_ms,
                        self.bus_worker.started,
                    )
                if self.orchestrators:
                    tg.start_soon(
                        run_scheduler, self.redis, self.partitions, self.clock, self.config, self._fired
                    )
                    tg.start_soon(self._every, self.config.heartbeat_ms, "heartbeat", self.heartbeat)
                    tg.start_soon(
                        self._every, self.config.stranded_check_ms, "stranded check", self.check_stranded
                    )
                    tg.start_soon(self._every, self.config.prune_interval_ms, "prune ended", self.prune_ended)
                    tg.start_soon(run_schedules, self.schedulers, self.clock, self.config)
                    if self.has_tasks:
                        tg.start_soon(self._every, self.config.timer_poll_ms, "task timers", self.fire_tasks)
                try:
                    await self.bus_worker.run()
                except RedisDataLost as error:  # raised as itself below, not wrapped in a group
                    lost = error
                tg.cancel_scope.cancel()
            if lost is not None:
                raise lost
        finally:
            await self._leave()
            for hook in self.app.on_stop:
                await hook()

    async def _every(self, period_ms: int, name: str, job: Callable[[], Awaitable[object]]) -> None:
        while True:
            await self.clock.sleep(period_ms / 1000)
            try:
                await job()
            except BusError as error:
                _log.warning("periodic job failed; trying again later", job=name, error=str(error))

    async def fire_tasks(self) -> int:
        """Fire the due reminders and escalation steps of the task inbox."""
        return await self.tasks.fire_due(self.partitions) if self.has_tasks else 0

    def _fired(self, timers: Round) -> None:
        for observer in self.timer_observers:
            observer(timers)

    async def _leave(self) -> None:
        """Withdraw this worker's registration (best effort: it expires anyway)."""
        with anyio.CancelScope(shield=True):
            for context in self.app.registry.contexts:
                try:
                    await self.versions.leave(context, self.bus_worker.consumer)
                except BusError as error:
                    _log.warning("could not withdraw the worker registration", error=str(error))

    async def run_until_idle(self, *, max_rounds: int = 10_000) -> None:
        """Handle everything due now (entries, timers, schedules), then return: for tests and demos."""
        for _ in range(max_rounds):
            # entries first: handling them may make timers due now (a freed slot wakes a saga)
            await self.bus_worker.run_until_idle()
            timers = await fire_round(self.redis, self.partitions, self.clock, self.config.timer_batch)
            if timers.fired:
                self._fired(timers)
            fired = timers.fired
            for scheduler in self.schedulers:
                fired += await scheduler.tick()
            fired += await self.fire_tasks()
            if not fired:
                return
        raise RuntimeError(f"still busy after {max_rounds} rounds")
