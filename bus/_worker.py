"""The worker: runs every subscription of one or more :class:`~bus.Bus` apps until stopped.

Loops, all on one anyio task group:

- one reader per subscription: XREADGROUP as many entries as there are free slots;
- the lease keeper: heartbeats in-flight entries, cancels handlers whose lease was lost,
  and those whose heartbeats have not got through for most of the lease (a partition:
  the lease will expire and another consumer may run the entry);
- the reclaimer: XAUTOCLAIM entries idle past the lease (dead or stalled consumers, and
  redeliveries scheduled after transient failures);
- the completer: sends acks, results and dead letters in pipelined batches;
- maintenance: safe trimming and removal of idle, empty consumers;
- the epoch check: stops the worker with :class:`~bus.RedisDataLost` when Redis came back
  without its data (``bus/_epoch.py``).

Every loop survives Redis outages (back-off with jitter, then resume) and recreates a
consumer group that an operator deleted. :meth:`Worker.stop` drains gracefully: readers
stop, in-flight handlers get ``shutdown_grace_s`` to finish, the rest stay pending for
another worker. :meth:`Worker.serve` does the same on SIGTERM or SIGINT (a second signal
stops at once), which is how a worker process should run.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import anyio

from bus._app import Bus
from bus._auth import Authenticator
from bus._backoff import Backoff
from bus._client import Redis, is_embedded
from bus._clock import Clock, SystemClock
from bus._completer import Completer
from bus._config import BusConfig
from bus._consumer import GroupConsumer, Runtime
from bus._epoch import check_epoch, join_epoch
from bus._errors import BusError, GroupMissing, RedisDataLost, UnsafeRedisConfig
from bus._log import get_logger
from bus._maintenance import run_maintenance
from bus._pool import HandlerPool
from bus._publisher import Publisher
from bus._safety import check_redis_settings
from bus._signals import DEFAULT_SIGNALS, serve
from bus._slots import Slots

_log = get_logger("redsaga.bus")


def default_consumer_name() -> str:
    """A consumer name unique to this process: ``host-pid-random``."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Worker:
    """Consumes the subscriptions of ``apps`` with leases, retries and dead letters.

    ``auth`` signs and checks entries (``bus/_auth.py``; default: what ``REDSAGA_KEYRING``
    says); it must hold a keyring for every principal the subscriptions act as. Without a
    keyring the worker refuses to start (:class:`AuthError`) unless signing was turned off
    on purpose (``REDSAGA_VERIFY=off``, :data:`SIGNING_OFF`) or ``redis`` is the embedded
    in-process Redis; running unauthenticated, it says so in a warning at start-up.
    ``epoch_writer`` false makes the worker only read ``rs:epoch`` (``bus/_epoch.py``): what a
    participant's ACL user may do.
    """

    def __init__(
        self,
        redis: Redis,
        *apps: Bus,
        config: BusConfig | None = None,
        clock: Clock | None = None,
        consumer: str | None = None,
        auth: Authenticator | None = None,
        epoch_writer: bool = True,
    ) -> None:
        if not apps:
            raise ValueError("a Worker needs at least one Bus")
        config = config or BusConfig()
        clock = clock or SystemClock()
        auth = Authenticator.from_env() if auth is None else auth
        auth.check_running(f"the worker of {apps[0].name!r}", embedded=is_embedded(redis))
        for subscription in (s for app in apps for s in app.subscriptions):
            auth.require_reader(subscription.principal, subscription.audience)
        self.runtime = Runtime(
            redis=redis,
            config=config,
            clock=clock,
            consumer=consumer or default_consumer_name(),
            source=apps[0].name,
            slots=Slots(config.concurrency),
            completer=Completer(redis, clock),
            publisher=Publisher(
                redis, source=apps[0].name, config=config, auth=auth, principal=apps[0].principal
            ),
            auth=auth,
        )
        self.consumers = [GroupConsumer(self.runtime, s) for app in apps for s in app.subscriptions]
        # A reader holds the slots it reserved while its read blocks, so each reader takes at
        # most a fair share: one idle stream must not starve the others of slots.
        self.runtime.read_share = max(
            1, min(config.read_batch, config.concurrency // max(1, len(self.consumers)))
        )
        self.started = anyio.Event()
        self.epoch: str | None = None
        self.epoch_writer = epoch_writer
        """Whether this worker may create ``rs:epoch`` and mark it lost (a participant may not)."""
        self._prepared = False
        self._lost: RedisDataLost | None = None
        self._abort: anyio.CancelScope | None = None  # run()'s, made there (it needs a loop)
        self._stopping = anyio.Event()
        self._log = _log.bind(consumer=self.runtime.consumer)

    @property
    def incidents(self) -> Counter[str]:
        """Operator faults this worker met and repaired, by kind (a live view).

        ``group_recreated``: a consumer group or its stream vanished (``XGROUP DESTROY``,
        ``DEL``) and was recreated; ``entry_lost``: a pending entry was deleted or trimmed
        (a ``raw_missing`` dead letter records it); ``lease_lost``: a heartbeat found an
        in-flight entry no longer held (taken over, or dropped by ``XGROUP DELCONSUMER``).
        Each is also logged at ERROR (WARNING for leases) with the same ``incident`` name.
        """
        return self.runtime.incidents

    @property
    def consumer(self) -> str:
        """This worker's consumer name in every group."""
        return self.runtime.consumer

    def stop(self) -> None:
        """Ask :meth:`run` to stop gracefully (safe to call from a signal handler task)."""
        self._stopping.set()

    async def serve(self, signals: Sequence[signal.Signals] = DEFAULT_SIGNALS) -> None:
        """Run until SIGTERM or SIGINT, then drain gracefully (a second signal stops at once).

        This is how a worker process should run; see :mod:`bus._signals`.
        """
        await serve(self, signals)

    async def preflight(self) -> None:
        """Check Redis's settings and join the deployment's epoch, before anything is written.

        Done once; retried while Redis is unreachable. Raises
        :class:`~bus.UnsafeRedisConfig` on settings that lose data when configured to refuse
        them (``bus/_safety.py``), and :class:`~bus.RedisDataLost` when a worker saw Redis
        lose its data and no operator accepted a new epoch since (``bus/_epoch.py``).
        """
        if self._prepared:
            return
        await self._retrying("check Redis settings", self._check_settings)
        if self.runtime.config.epoch_check_ms is not None:

            async def join() -> None:
                self.epoch = await join_epoch(self.runtime.redis, create=self.epoch_writer)

            await self._retrying("join epoch", join)
        self._prepared = True

    async def _check_settings(self) -> None:
        await check_redis_settings(self.runtime.redis, self.runtime.config)

    async def setup(self) -> None:
        """Create every consumer group (idempotent)."""
        for consumer in self.consumers:
            await consumer.ensure_group()

    async def run(self) -> None:
        """Consume until :meth:`stop` is called, then drain gracefully.

        Stopping never cancels a Redis call in flight (entries Redis already handed over
        would wait for a lease to expire): the loops finish their current call and exit.
        Raises :class:`~bus.RedisDataLost`, at once, when Redis lost its data.
        """
        await self.preflight()
        await self._retrying("setup", self.setup)
        self._abort = anyio.CancelScope()
        with self._abort:
            await self._run()
        if self._lost is not None:
            raise self._lost

    async def _run(self) -> None:
        config, clock = self.runtime.config, self.runtime.clock
        async with anyio.create_task_group() as services:
            services.start_soon(self.runtime.completer.run)
            services.start_soon(self._heartbeat_loop)
            services.start_soon(self._lease_watchdog)
            async with anyio.create_task_group() as handler_group:
                # leaving the pool (no more reads) ends idle handler tasks; busy ones finish
                with HandlerPool(handler_group, config.concurrency) as handlers:
                    async with anyio.create_task_group() as loops:
                        for consumer in self.consumers:
                            loops.start_soon(self._read_loop, consumer, handlers)
                        loops.start_soon(
                            self._every,
                            config.reclaim_interval_ms,
                            "reclaim",
                            lambda: self._reclaim_all(handlers),
                        )
                        loops.start_soon(
                            self._every, config.maintenance_interval_ms, "maintenance", self._maintain
                        )
                        if self.epoch is not None and config.epoch_check_ms is not None:
                            loops.start_soon(
                                self._every, config.epoch_check_ms, "epoch check", self._check_epoch
                            )
                        self.started.set()
                        self._log.info("worker started", subscriptions=len(self.consumers))
                self._log.info(
                    "worker stopping; letting in-flight handlers finish",
                    inflight=self.runtime.slots.busy,
                    grace_s=config.shutdown_grace_s,
                )

                async def deadline() -> None:
                    await clock.sleep(config.shutdown_grace_s)
                    handler_group.cancel_scope.cancel()

                services.start_soon(deadline)
            await self.runtime.completer.flush()
            services.cancel_scope.cancel()
        self._log.info("worker stopped")

    async def run_until_idle(self) -> None:
        """Handle everything available now, then return (deterministic tests, batch jobs).

        Reads without blocking, reclaims expired leases, waits for handlers and their
        completions, and stops once a whole pass finds nothing to do.
        """
        await self.setup()
        async with anyio.create_task_group() as services:
            services.start_soon(self.runtime.completer.run)
            async with anyio.create_task_group() as handler_group:
                with HandlerPool(handler_group, self.runtime.config.concurrency) as handlers:
                    while True:
                        found = 0
                        for consumer in self.consumers:
                            found += await consumer.read(handlers, block_ms=None)
                            found += await consumer.reclaim(handlers)
                        await self.runtime.slots.wait_all_free()
                        await self.runtime.completer.wait_idle()
                        if not found:
                            break
            services.cancel_scope.cancel()

    async def _read_loop(self, consumer: GroupConsumer, handlers: HandlerPool) -> None:
        backoff = Backoff(self.runtime.clock)
        while not self._stopping.is_set():
            try:
                await consumer.read(handlers, block_ms=self.runtime.config.block_ms)
                backoff.reset()
            except GroupMissing as error:
                try:
                    await self._retrying(
                        "recreate group", functools.partial(self._recreate_group, consumer, error)
                    )
                except RedisDataLost as lost:
                    self._data_lost(lost)
            except BusError as error:
                self._log.warning("read failed; backing off", stream=consumer.stream.key, error=str(error))
                await self._unless_stopping(backoff.wait())

    async def _unless_stopping(self, wait: Awaitable[None]) -> None:
        """Await ``wait`` (a sleep), cut short when the worker is asked to stop."""
        async with anyio.create_task_group() as race:

            async def stop_waiting() -> None:
                await self._stopping.wait()
                race.cancel_scope.cancel()

            race.start_soon(stop_waiting)
            await wait
            race.cancel_scope.cancel()

    async def _heartbeat_loop(self) -> None:
        period_ms = self.runtime.config.effective_heartbeat_ms
        backoff = Backoff(self.runtime.clock)
        while True:
            await self.runtime.clock.sleep(period_ms / 3000)
            now = self.runtime.clock.now_ms()
            for consumer in self.consumers:
                due = [d for d in consumer.inflight.values() if d and now - d.last_beat_ms >= period_ms]
                if not due:
                    continue
                try:
                    await consumer.heartbeat(due)
                    backoff.reset()
                except BusError as error:
                    self._log.warning("heartbeat failed", stream=consumer.stream.key, error=str(error))
                    await backoff.wait()

    async def _lease_watchdog(self) -> None:
        # Apart from the heartbeat loop, whose call may hang until the socket times out.
        config, clock = self.runtime.config, self.runtime.clock
        while True:
            await clock.sleep(config.lease_ms / 10_000)
            cutoff = clock.now_ms() - config.give_up_ms
            for consumer in self.consumers:
                consumer.abandon_unbeaten(cutoff)

    async def _reclaim_all(self, handlers: HandlerPool) -> None:
        for consumer in self.consumers:
            try:
                await consumer.reclaim(handlers)
            except GroupMissing as error:
                await self._recreate_group(consumer, error)

    async def _recreate_group(self, consumer: GroupConsumer, error: GroupMissing) -> None:
        """Recreate a vanished group, unless it vanished with the rest of Redis's data."""
        await self._check_epoch()
        await consumer.recreate_group(error)

    async def _check_epoch(self) -> None:
        if self.epoch is not None:
            await check_epoch(self.runtime.redis, self.epoch, mark=self.epoch_writer)

    def _data_lost(self, lost: RedisDataLost) -> None:
        """Stop at once: there is nothing left to consume correctly."""
        self._log.error("Redis lost its data; the worker stops", error=str(lost))
        self._lost = lost
        if self._abort is not None:
            self._abort.cancel()

    async def _maintain(self) -> None:
        await run_maintenance(
            self.runtime.redis, [c.sub for c in self.consumers], self.runtime.config, consumer=self.consumer
        )

    async def _every(self, period_ms: int, name: str, job: Callable[[], Awaitable[object]]) -> None:
        while True:
            await self._unless_stopping(self.runtime.clock.sleep(period_ms / 1000))
            if self._stopping.is_set():
                return
            try:
                await job()
            except RedisDataLost as lost:
                self._data_lost(lost)
                return
            except BusError as error:
                self._log.warning("periodic job failed; will try again", job=name, error=str(error))

    async def _retrying(self, name: str, job: Callable[[], Awaitable[object]]) -> None:
        """Run ``job`` until it succeeds, backing off while Redis is unavailable.

        A failure that retrying cannot fix (a missing ACL permission, a key of the wrong
        type) is raised: a worker that cannot create its groups stops with that error
        instead of logging the same warning forever.
        """
        backoff = Backoff(self.runtime.clock)
        while True:
            try:
                await job()
            except (RedisDataLost, UnsafeRedisConfig):
                raise
            except BusError as error:
                if not error.retryable:
                    self._log.error("call failed; retrying cannot help", job=name, error=str(error))
                    raise
                self._log.warning("call failed; retrying", job=name, error=str(error))
                await self._unless_stopping(backoff.wait())
                if self._stopping.is_set():
                    return
            else:
                return
