"""Prometheus metrics of a relay, and its readiness.

The outbox's figures -- rows waiting, how long the oldest has waited, rows that failed -- are
read from the database at scrape time (:meth:`~relay.Relay.stats`: two indexed queries on a
short connection of their own, beside the relay's rounds, never per row); what the relay
did -- rows sent, repeats, failures, outages -- is copied from its :class:`~relay.RelayCounters`.
Every metric carries the outbox table's name (``table``) and its database (``database``:
``host:port/dbname``, or the SQLite file; never a user or password), so one Prometheus tells
the outboxes of several services apart, those of one table name in two databases too.

Readiness (``/readyz``): the outbox database answers, Redis answers, and ``rs:epoch`` holds
a live epoch, the one this relay saw first (a Redis that came back empty, or was marked
lost, is not one to publish into: ``bus/_epoch.py``).
"""

from __future__ import annotations

import anyio
from prometheus_client import CollectorRegistry

from bus import BusError, read_epoch
from bus.lowlevel import redis_errors
from bus.metrics import BUILD_INFO, Exporter, Figures, MetricSpec, ScrapeCollector, build_labels
from relay._errors import RelayError
from relay._relay import Relay

DATABASE = "the database"
_TABLE = ("table", "database")

OUTBOX_BACKLOG = MetricSpec(
    "redsaga_outbox_backlog", "gauge", "Outbox rows committed and not yet sent.", _TABLE, source=DATABASE
)
OUTBOX_OLDEST_UNSENT = MetricSpec(
    "redsaga_outbox_oldest_unsent_seconds",
    "gauge",
    "How long the oldest unsent outbox row has waited since it was written (0 when none waits).",
    _TABLE,
    source=DATABASE,
)
OUTBOX_FAILED = MetricSpec(
    "redsaga_outbox_failed",
    "gauge",
    "Outbox rows the relay could not publish, waiting for an operator (saga relay failed, requeue).",
    _TABLE,
    source=DATABASE,
)
RELAY_ROWS = MetricSpec(
    "redsaga_relay_rows_total",
    "counter",
    "Outbox rows this relay finished: outcome sent (published), repeat (published before a crash: "
    "marked sent, no new entry) or failed.",
    ("table", "database", "outcome"),
)
RELAY_OUTAGES = MetricSpec(
    "redsaga_relay_outages_total",
    "counter",
    "Rounds this relay lost to a database or Redis outage (it backed off and reconnected).",
    _TABLE,
)
DATABASE_UP = MetricSpec(
    "redsaga_relay_database_up",
    "gauge",
    "1 when this scrape read the outbox database, 0 when it could not (the outbox figures are missing).",
    _TABLE,
)
RELAY_METRICS = (
    BUILD_INFO,
    OUTBOX_BACKLOG,
    OUTBOX_OLDEST_UNSENT,
    OUTBOX_FAILED,
    RELAY_ROWS,
    RELAY_OUTAGES,
    DATABASE_UP,
)
"""Every metric a relay exports."""


class OutboxMetrics(ScrapeCollector):
    """The figures of one relay and its outbox (see the module docstring)."""

    specs = RELAY_METRICS
    up = DATABASE_UP
    read_errors = (RelayError,)

    def __init__(self, relay: Relay, *, timeout_s: float = 5.0) -> None:
        super().__init__(timeout_s=timeout_s)
        self.relay = relay
        self.table = relay.config.tables.outbox
        self.labels = (self.table, relay.store.database)
        """``table`` and ``database``: two relays' outboxes of one name in two databases stay apart."""
        self.up_labels = self.labels

    def count(self, figures: Figures) -> None:
        """The build, rows finished by outcome, and outages."""
        figures.set(BUILD_INFO, build_labels(), 1)
        counters = self.relay.counters
        for outcome, rows in (
            ("sent", counters.sent),
            ("repeat", counters.repeats),
            ("failed", counters.failed),
        ):
            figures.set(RELAY_ROWS, (*self.labels, outcome), rows)
        figures.set(RELAY_OUTAGES, self.labels, counters.outages)

    async def read(self, figures: Figures) -> None:
        """The backlog, its oldest row's age and the failed rows, from the database."""
        stats = await self.relay.stats()
        figures.set(OUTBOX_BACKLOG, self.labels, stats.backlog)
        figures.set(OUTBOX_OLDEST_UNSENT, self.labels, (stats.oldest_unsent_age_ms or 0) / 1000)
        figures.set(OUTBOX_FAILED, self.labels, stats.failed)


class RelayMetrics(Exporter):
    """Prometheus metrics of one relay, registered on ``registry``, and its readiness.

    ``saga relay --metrics-port`` serves them with :meth:`~bus.metrics.Exporter.server`; a
    service that embeds a :class:`~relay.Relay` and already serves ``/metrics`` passes its
    registry (``prometheus_client.REGISTRY`` for the default one). Create it on the relay's
    event loop. ``timeout_s``: how long one scrape or readiness check may wait for the
    database or Redis.
    """

    def __init__(
        self, relay: Relay, *, registry: CollectorRegistry | None = None, timeout_s: float = 5.0
    ) -> None:
        super().__init__(registry)
        self.relay = relay
        self.timeout_s = timeout_s
        self.outbox = OutboxMetrics(relay, timeout_s=timeout_s)
        """The relay's and its outbox's figures."""
        self.add(self.outbox)
        self.epoch: str | None = None
        """The epoch the first readiness check found in ``rs:epoch`` (``None`` before)."""

    async def ready(self) -> list[str]:
        """Why the relay is not ready (empty: ready); see the module docstring."""
        return [*await self._database(), *await self._redis()]

    async def _database(self) -> list[str]:
        try:
            with anyio.fail_after(self.timeout_s):
                await self.relay.stats()
        except (RelayError, TimeoutError) as error:
            return [f"the outbox database does not answer: {error or 'timed out'}"]
        return []

    async def _redis(self) -> list[str]:
        try:
            with anyio.fail_after(self.timeout_s), redis_errors():
                await self.relay.redis.ping()
                found = await read_epoch(self.relay.redis)
        except (BusError, TimeoutError) as error:
            return [f"Redis does not answer: {error or 'timed out'}"]
        if found is None:
            return ["rs:epoch is not set: no orchestrator has started on this Redis yet"]
        if found.startswith("lost:"):
            return [f"Redis lost its data: rs:epoch holds {found!r} (saga epoch accept, once restored)"]
        if self.epoch is None:
            self.epoch = found
        elif found != self.epoch:
            return [f"rs:epoch holds {found!r}, not the epoch {self.epoch!r} this relay saw first"]
        return []
