"""One saga fault scenario: a Redis database, a PostgreSQL schema, worker processes, a checker.

:func:`open_scenario` gives a :class:`Scenario` whose workers run ``tests/faults/app.py``
against the given Redis URL (the shared test database, or a test's own
:class:`~tests.faults.servers.PrivateRedis` for server faults) and a fresh PostgreSQL schema
(dropped afterwards), with every spawned process killed at the end. The seed
(``FAULTS_SEED``, else random) is printed first, so a failing run can be repeated.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psycopg

import bus
from bus.lowlevel import CRASH_ENV
from saga import Context, Registry, Saga, SagaClient, SagaState, SagaStatus
from tests.faults import app
from tests.faults.checker import Checker
from tests.faults.procs import Proc, Procs
from tests.helpers import eventually

SEED_ENV = "FAULTS_SEED"
MIX = ("", "", "", "charge", "ship")
"""A load's default failures: most sagas complete, one in five undoes a step, one in five three."""


def seed() -> int:
    """The scenario's seed: ``$FAULTS_SEED``, else a random one (printed by the caller)."""
    return int(os.environ.get(SEED_ENV) or random.randrange(1 << 30))


@dataclass
class Scenario:
    """What a saga fault test works with."""

    redis: bus.Redis
    client: SagaClient
    procs: Procs
    checker: Checker
    rng: random.Random
    pg_dsn: str
    schema: str
    order: Saga[app.Order] = app.order
    """The ``order`` saga in the scenario's fault context (its partition count)."""
    napper: Saga[app.Nap] = app.napper
    orders: dict[str, app.Order] = field(default_factory=dict)
    """Every ``order`` saga started, by id."""
    started: list[str] = field(default_factory=list)
    """Every saga started (``order`` and ``napper``), in order."""

    async def worker(self, name: str, *, crash_at: str | None = None) -> Proc:
        """Start a worker process and wait until it reads; ``crash_at`` arms a crash point."""
        env = {"FAULTS_CONSUMER": name}
        if crash_at:
            env[CRASH_ENV] = crash_at
        return await self.procs.start(name, **env)

    def spawn(self, name: str) -> Proc:
        """Start a worker process without waiting for it (a restart storm starts many at once)."""
        return self.procs.spawn(name, FAULTS_CONSUMER=name)

    def mixed(self, n: int, fail_steps: Iterable[str] = MIX, prefix: str = "job") -> list[app.Order]:
        """``n`` orders ``<prefix>-<i>``, each failing at a step drawn from ``fail_steps``
        by the seed (``""``: none), so a load completes some sagas and compensates others."""
        choices = list(fail_steps)
        return [app.Order(id=f"{prefix}-{i}", fail_step=self.rng.choice(choices)) for i in range(n)]

    async def start(self, orders: Iterable[app.Order]) -> list[str]:
        """Start one ``order`` saga per item (its id is the saga id); return the ids."""
        items = list(orders)
        for order in items:
            self.orders[order.id] = order
        await self._start_all([(self.order, order, order.id) for order in items])
        return [order.id for order in items]

    async def start_naps(self, ids: Iterable[str], ms: int) -> list[str]:
        """Start one ``napper`` saga per id, each sleeping ``ms`` before its step."""
        started = list(ids)
        await self._start_all([(self.napper, app.Nap(id=saga_id, ms=ms), saga_id) for saga_id in started])
        return started

    async def _start_all(self, items: list[tuple[Saga[Any], object, str]]) -> None:
        """Start sagas a few at a time (side by side, so that AOF fsyncs are shared)."""
        limit = anyio.Semaphore(32)
        self.started += [saga_id for *_, saga_id in items]

        async def one(definition: Saga[Any], data: object, saga_id: str) -> None:
            async with limit:
                await self.client.start(definition, data, saga_id=saga_id)

        async with anyio.create_task_group() as group:
            for item in items:
                group.start_soon(one, *item)

    def expected(self, saga_id: str) -> SagaStatus:
        """The end state a saga started here must reach (``napper`` sagas complete)."""
        order = self.orders.get(saga_id)
        return app.expected_end(order) if order else SagaStatus.COMPLETED

    def steps(self, saga_id: str) -> tuple[str, ...]:
        """The steps a completed saga applied effects for."""
        return app.STEPS if saga_id in self.orders else ("woke",)

    def implied(self, state: SagaState) -> list[tuple[str, str]] | None:
        """The effects a saga's end implies (``None`` when it ended other than expected:
        G1 reports that)."""
        if state.status != self.expected(state.id):
            return None
        order = self.orders.get(state.id)
        if order is None:
            return [("woke", "do")]
        return app.implied_effects(order, state.status)

    async def check(self, ids: Iterable[str], *, timeout: float = 30, **options: Any) -> None:
        """Wait for quiescence, then assert G1-G8 with the expected end states and the
        effects each end implies."""
        ids = list(ids)
        await self.checker.quiesce(ids, timeout)
        await self.checker.check(ids, expect=self.expected, steps=self.steps, implied=self.implied, **options)

    async def ended(self) -> int:
        """How many of the sagas started here are in an end state."""
        return len(self.started) - len(await self.checker.ended(self.started))

    async def wait_ended(self, at_least: int, timeout: float = 30) -> None:
        """Wait until ``at_least`` of the sagas started here ended."""

        async def enough() -> bool:
            return await self.ended() >= at_least

        await eventually(enough, timeout, f"{at_least} sagas ended", poll=0.01)

    async def status(self, saga_id: str) -> SagaStatus:
        """A saga's current status."""
        return (await self.client.get(saga_id)).status

    def query(self, sql: str, *params: object) -> list[tuple[object, ...]]:
        """Rows from the participant's tables."""
        with psycopg.connect(self.pg_dsn, autocommit=True, options=f"-c search_path={self.schema}") as pg:
            return pg.execute(sql, params).fetchall()  # type: ignore[arg-type]

    def calls(self, key: str, worker: str | None = None) -> int:
        """How many times a handler started for idempotency key ``key`` (by ``worker``)."""
        sql = "SELECT count(*) FROM attempts WHERE idem_key = %s AND phase = 'call'"
        if worker is None:
            return int(self.query(sql, key)[0][0])  # type: ignore[call-overload]
        return int(self.query(sql + " AND worker = %s", key, worker)[0][0])  # type: ignore[call-overload]

    def reruns(self) -> int:
        """Handler calls that found their idempotency key applied already: work re-driven
        after it took effect, which only the participant's dedupe kept from applying twice."""
        return int(str(self.query("SELECT count(*) FROM attempts WHERE phase = 'duplicate'")[0][0]))

    def last_attempt(self) -> int:
        """The sequence number of the latest attempts-log row (0 when there is none)."""
        return int(str(self.query("SELECT coalesce(max(seq), 0) FROM attempts")[0][0]))

    async def wait_calls(self, key: str, n: int, worker: str | None = None, timeout: float = 20) -> None:
        """Wait until a handler for ``key`` started ``n`` times (by ``worker``)."""
        await eventually(
            lambda: self.calls(key, worker) >= n, timeout, f"{n} calls for {key} by {worker or 'anyone'}"
        )


@asynccontextmanager
async def open_scenario(
    redis_url: str, pg_dsn: str, logs: Path, *, partitions: int = 1
) -> AsyncIterator[Scenario]:
    """A :class:`Scenario` on ``redis_url`` (an empty database) with its own schema, its fault
    context spread over ``partitions`` (the workers are told so by ``$FAULTS_PARTITIONS``)."""
    chosen = seed()
    print(f"fault scenario seed {chosen} (repeat with {SEED_ENV}={chosen})")
    schema = f"faults_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_dsn, autocommit=True) as pg:
        pg.execute(f"CREATE SCHEMA {schema}")  # type: ignore[arg-type]
        pg.execute(f"SET search_path TO {schema}")  # type: ignore[arg-type]
        pg.execute(app.SCHEMA)  # type: ignore[arg-type]
    redis = bus.connect(redis_url)
    order, napper = app.sagas(Context(app.CONTEXT.name, partitions=partitions))
    client = SagaClient(redis, Registry([order, napper]))
    env = {"FAULTS_REDIS_URL": redis_url, "FAULTS_PG_DSN": pg_dsn, "FAULTS_SCHEMA": schema}
    procs = Procs("tests.faults.app", logs, {**env, app.PARTITIONS_ENV: str(partitions)})
    checker = Checker(redis, client, pg_dsn, schema, app.CONTEXT.name, chosen, partitions)
    rng = random.Random(chosen)
    try:
        yield Scenario(redis, client, procs, checker, rng, pg_dsn, schema, order, napper)
    finally:
        procs.kill_all()
        await redis.aclose()
        with psycopg.connect(pg_dsn, autocommit=True) as pg:
            pg.execute(f"DROP SCHEMA {schema} CASCADE")  # type: ignore[arg-type]
