"""Prometheus metrics of a bus worker, and its readiness.

Two kinds of figures, kept apart on purpose:

- **counted by the process** on the hot path as plain ints and :class:`~bus._tally.Buckets`
  (deliveries, redeliveries, lease losses, incidents, Redis round trips): nothing per
  message touches the Prometheus client;
- **read from Redis at scrape time** by one collector per worker (pending entries and lag
  per stream and group, dead letters): a handful of commands per stream per scrape, never
  per message.

A :class:`ScrapeCollector` refreshes both on the worker's event loop (:meth:`refresh`) and
hands Prometheus the copy: ``collect()`` called from another thread (``prometheus_client``'s
own HTTP server) runs the refresh on the loop and waits for it; called on the loop, it
returns what the last refresh read, so an async ``/metrics`` handler awaits :meth:`refresh`
first (:class:`bus._http.MetricsServer` does). ``redsaga_redis_up`` says whether the last
scrape could read Redis; when it could not, the figures read from Redis are left out rather
than shown stale.

Readiness (:func:`readiness`, ``/readyz``): the worker reads its streams, Redis answers,
``rs:epoch`` still holds the epoch the worker joined (``bus/_epoch.py``) and every consumer
group it reads exists.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.metadata
import platform
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from bus._consumer import LEASE_LOST, GroupConsumer
from bus._epoch import read_epoch
from bus._errors import BusError, redis_errors
from bus._log import get_logger
from bus._tally import Buckets
from redsaga.streams import Stream

if TYPE_CHECKING:
    from bus._worker import Worker

_log = get_logger("redsaga.bus")
Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[str, ...]
Values = Mapping[Labels, float] | Mapping[Labels, Buckets]
REDIS = "Redis"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric: its name, type, help text and labels.

    ``source`` names where a figure read at scrape time comes from (``"Redis"``, ``"the
    database"``; left out when that scrape could not read it); empty for figures the process
    counts.
    """

    name: str
    kind: Kind
    help: str
    labels: Labels = ()
    source: str = ""

    @property
    def scraped(self) -> bool:
        """Whether the figure is read at scrape time (from :attr:`source`)."""
        return bool(self.source)

    @property
    def samples(self) -> tuple[str, ...]:
        """The sample names Prometheus stores for this metric (what PromQL can name)."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)

    def family(self, values: Values = {}) -> Metric:  # noqa: B006 - never mutated
        """The metric family holding ``values`` (by label values)."""
        if self.kind == "histogram":
            histogram = HistogramMetricFamily(self.name, self.help, labels=self.labels)
            for labels, buckets in values.items():
                assert isinstance(buckets, Buckets)  # noqa: S101 - a histogram's values
                histogram.add_metric(list(labels), buckets.cumulative(), buckets.total)
            return histogram
        family: CounterMetricFamily | GaugeMetricFamily = (
            CounterMetricFamily(self.name, self.help, labels=self.labels)
            if self.kind == "counter"
            else GaugeMetricFamily(self.name, self.help, labels=self.labels)
        )
        for labels, value in values.items():
            assert not isinstance(value, Buckets)  # noqa: S101 - a counter's or gauge's values
            family.add_metric(list(labels), value)
        return family


_STREAM: Final = ("stream", "partition")
"""A stream as labels: ``<tag>/<name>`` without the partition (``orders/inbox``,
``orders/cmd:payments``; a plain-named stream, its name) and the partition (``""`` when the
stream has none): never a raw key, so streams of every partition aggregate by ``stream``."""
_STREAM_GROUP: Final = (*_STREAM, "group")

DELIVERIES = MetricSpec(
    "redsaga_deliveries_total",
    "counter",
    "Stream entries handed to this worker's handlers (read or taken over).",
    _STREAM_GROUP,
)
REDELIVERIES = MetricSpec(
    "redsaga_redeliveries_total",
    "counter",
    "Entries this worker took over after their lease expired (a retry's back-off, or a dead or "
    "stalled consumer).",
    _STREAM_GROUP,
)
LEASE_LOSSES = MetricSpec(
    "redsaga_lease_losses_total",
    "counter",
    "In-flight entries whose lease this worker found taken over (their handlers were cancelled).",
)
INCIDENTS = MetricSpec(
    "redsaga_incidents_total",
    "counter",
    "Operator faults this worker met and repaired: group_recreated, entry_lost, unauthenticated, "
    "letters_over_quota (dead letters counted, not kept: a principal past BusConfig.letter_quota), "
    "dedupe_over_quota (deliveries retried: their group held BusConfig.dedupe_quota dedupe records).",
    ("kind",),
)
QUEUE_WAIT = MetricSpec(
    "redsaga_queue_wait_seconds",
    "histogram",
    "How long entries waited in their stream before this worker read them (for commands: "
    "schedule-to-start), from when Redis added them to the read, by this worker's clock.",
    _STREAM_GROUP,
)
HANDLER_SLOTS = MetricSpec(
    "redsaga_handler_slots",
    "gauge",
    "Handler slots (--concurrency) holding an entry (state=busy) or not (state=free).",
    ("state",),
)
ROUND_TRIPS = MetricSpec(
    "redsaga_redis_roundtrip_seconds",
    "histogram",
    "Round trips of the pipelines that end deliveries (acks, results, commits, dead letters).",
)
REDIS_UP = MetricSpec(
    "redsaga_redis_up",
    "gauge",
    "1 when this scrape read Redis, 0 when it could not (the figures read from Redis are missing).",
)
STREAM_PENDING = MetricSpec(
    "redsaga_stream_pending",
    "gauge",
    "Entries delivered to the group's consumers and not yet acknowledged (XINFO GROUPS pending).",
    _STREAM_GROUP,
    source=REDIS,
)
STREAM_LAG = MetricSpec(
    "redsaga_stream_lag",
    "gauge",
    "Entries in the stream not yet delivered to the group (XINFO GROUPS lag; missing when Redis "
    "cannot tell).",
    _STREAM_GROUP,
    source=REDIS,
)
DEAD_LETTERS = MetricSpec(
    "redsaga_dead_letters",
    "gauge",
    "Letters in a dead-letter stream (exported by workers whose user may read it: orchestrators).",
    _STREAM,
    source=REDIS,
)
BUILD_INFO = MetricSpec(
    "redsaga_build_info",
    "gauge",
    "Always 1: the redsaga and Python versions this process runs (absent: no process exports).",
    ("version", "python"),
)
BUS_METRICS = (
    BUILD_INFO,
    DELIVERIES,
    REDELIVERIES,
    QUEUE_WAIT,
    LEASE_LOSSES,
    INCIDENTS,
    HANDLER_SLOTS,
    ROUND_TRIPS,
    REDIS_UP,
    STREAM_PENDING,
    STREAM_LAG,
    DEAD_LETTERS,
)
"""Every metric a bus worker exports."""


@dataclass(slots=True)
class Figures:
    """One scrape's values, by metric name and label values."""

    values: dict[str, dict[Labels, Any]] = field(default_factory=dict)

    def set(self, spec: MetricSpec, labels: Labels, value: float | Buckets) -> None:
        """Record ``value`` for ``spec`` at ``labels``."""
        self.values.setdefault(spec.name, {})[labels] = value


class ScrapeCollector(Collector):
    """A collector whose figures are refreshed on the worker's loop (see the module docstring).

    Subclasses name their metrics in ``specs`` and fill a :class:`Figures` in :meth:`count`
    (the process's tallies: no await, so the copy is consistent) and :meth:`read` (what is
    read at scrape time: Redis, or a relay's database). ``up``, when set, is the gauge that
    says whether the last :meth:`read` succeeded (at ``up_labels``); ``read_errors`` are the
    errors that mean it could not (the scrape goes on without those figures).
    """

    specs: tuple[MetricSpec, ...] = ()
    up: MetricSpec | None = None
    up_labels: Labels = ()
    read_errors: tuple[type[Exception], ...] = (BusError,)

    def __init__(self, *, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        """How long a refresh may read Redis before the scrape goes on without it."""
        self._families: list[Metric] = [spec.family() for spec in self.specs]
        self._loop: asyncio.AbstractEventLoop | None = _running_loop()

    def count(self, figures: Figures) -> None:
        """Copy what the process counted into ``figures``."""

    async def read(self, figures: Figures) -> None:
        """Read the figures of scrape time into ``figures`` (may raise one of ``read_errors``)."""

    async def refresh(self) -> bool:
        """Read everything now, on the worker's loop; return whether :meth:`read` succeeded."""
        self._loop = asyncio.get_running_loop()
        counted, read = Figures(), Figures()
        up = True
        unreadable: tuple[type[Exception], ...] = (*self.read_errors, TimeoutError)
        try:
            with anyio.fail_after(self.timeout_s):
                await self.read(read)
        except unreadable as error:
            _log.warning("metrics: figures could not be read at scrape time", error=str(error) or "timed out")
            up = False
        self.count(counted)
        if self.up is not None:
            counted.set(self.up, self.up_labels, 1.0 if up else 0.0)
        self._families = [
            spec.family(
                {}
                if spec.scraped and not up
                else (read if spec.scraped else counted).values.get(spec.name, {})
            )
            for spec in self.specs
        ]
        return up

    def collect(self) -> Iterable[Metric]:
        """The figures of the latest refresh (run first when called off the worker's loop)."""
        loop = self._loop
        if loop is not None and loop.is_running() and _running_loop() is not loop:
            future = asyncio.run_coroutine_threadsafe(self.refresh(), loop)
            try:
                future.result(self.timeout_s + 1.0)
            except concurrent.futures.TimeoutError:
                future.cancel()  # the loop is stuck: export what the last refresh read
        return list(self._families)

    def describe(self) -> Iterable[Metric]:
        """Empty families: registering the collector reads nothing."""
        return [spec.family() for spec in self.specs]


@functools.lru_cache(maxsize=4096)
def stream_labels(key: str) -> tuple[str, str]:
    """The ``stream`` and ``partition`` labels of the stream at ``key`` (see ``_STREAM``)."""
    try:
        stream = Stream.from_key(key)
    except ValueError:
        return key, ""
    tag, colon, index = stream.tag.rpartition(":")
    if not (colon and index.isdigit()):
        tag, index = stream.tag, ""
    return (tag if stream.name == "stream" else f"{tag}/{stream.name}"), index


@functools.cache
def build_labels() -> Labels:
    """:data:`BUILD_INFO`'s labels: the installed redsaga's version, and Python's."""
    try:
        version = importlib.metadata.version("redsaga")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout without installing
        version = "unknown"
    return (version, platform.python_version())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class BusMetrics(ScrapeCollector):
    """The metrics of one :class:`~bus.Worker`: its consumers' counts and their streams' backlog.

    ``dead_letters``: also read the dead-letter streams of the streams it consumes (a
    participant's ACL user may only write them). Installing it starts timing the worker's
    completion round trips.
    """

    specs = BUS_METRICS
    up = REDIS_UP

    def __init__(self, worker: Worker, *, dead_letters: bool = True, timeout_s: float = 5.0) -> None:
        super().__init__(timeout_s=timeout_s)
        self.worker = worker
        self.dead_letters = dead_letters
        self.round_trips = worker.runtime.completer.round_trips = Buckets()
        for consumer in worker.consumers:
            consumer.queue_wait = Buckets()

    def count(self, figures: Figures) -> None:
        """The build, deliveries per stream and group, leases lost, incidents, slots, round trips."""
        figures.set(BUILD_INFO, build_labels(), 1)
        runtime = self.worker.runtime
        busy = 0
        for consumer in self.worker.consumers:
            labels = (*stream_labels(consumer.stream.key), consumer.sub.group)
            figures.set(DELIVERIES, labels, consumer.delivered)
            figures.set(REDELIVERIES, labels, consumer.redelivered)
            if consumer.queue_wait is not None:
                figures.set(QUEUE_WAIT, labels, consumer.queue_wait.copy())
            busy += len(consumer.inflight)
        figures.set(LEASE_LOSSES, (), runtime.incidents[LEASE_LOST])
        for kind, count in runtime.incidents.items():
            if kind != LEASE_LOST:
                figures.set(INCIDENTS, (kind,), count)
        figures.set(HANDLER_SLOTS, ("busy",), busy)
        figures.set(HANDLER_SLOTS, ("free",), max(0, runtime.slots.total - busy))
        figures.set(ROUND_TRIPS, (), self.round_trips.copy())

    async def read(self, figures: Figures) -> None:
        """Pending and lag of this worker's groups; its streams' dead letters."""
        redis = self.worker.runtime.redis
        for stream, groups in (await group_infos(redis, self.worker.consumers)).items():
            for consumer in self.worker.consumers:
                info = groups.get(consumer.sub.group) if consumer.stream.key == stream else None
                if info is None:
                    continue
                labels = (*stream_labels(stream), consumer.sub.group)
                figures.set(STREAM_PENDING, labels, int(info["pending"]))
                if info.get("lag") is not None:
                    figures.set(STREAM_LAG, labels, int(info["lag"]))
        if self.dead_letters:
            with redis_errors():
                for dlq in sorted({c.stream.dlq_key for c in self.worker.consumers}):
                    figures.set(DEAD_LETTERS, stream_labels(dlq), int(await redis.xlen(dlq)))


async def group_infos(redis: Any, consumers: Sequence[GroupConsumer]) -> dict[str, dict[str, Any]]:
    """``XINFO GROUPS`` of every stream ``consumers`` read: stream -> group name -> info."""
    infos: dict[str, dict[str, Any]] = {}
    with redis_errors():
        for stream in sorted({c.stream.key for c in consumers}):
            # A deleted stream has no groups (XINFO would answer an error)
            groups = await redis.xinfo_groups(stream) if await redis.exists(stream) else []
            infos[stream] = {_text(g["name"]): g for g in groups}
    return infos


async def readiness(worker: Worker) -> list[str]:
    """Why ``worker`` is not ready to work (empty: ready); see the module docstring."""
    if worker._lost is not None:
        return [f"Redis lost its data: {worker._lost}"]
    if not worker.started.is_set():
        return ["the worker is not reading its streams yet"]
    redis, problems = worker.runtime.redis, []
    try:
        with anyio.fail_after(5.0), redis_errors():
            await redis.ping()
            if worker.epoch is not None:
                found = await read_epoch(redis)
                if found != worker.epoch:
                    problems.append(f"rs:epoch holds {found!r}, not the epoch {worker.epoch!r} joined")
            infos = await group_infos(redis, worker.consumers)
    except (BusError, TimeoutError) as error:
        return [f"Redis does not answer: {error or 'timed out'}"]
    problems.extend(
        f"consumer group {c.sub.group!r} of {c.stream.key} is missing"
        for c in worker.consumers
        if c.sub.group not in infos.get(c.stream.key, {})
    )
    return problems


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
