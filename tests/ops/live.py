"""A live system for the command-line tests: the scenario's sagas, and an orchestrator
running in a background thread that decides whatever the commands send.

The orchestrator keeps the scenario's fake clock (stopped), so no timer fires behind the
tests' back; it reads its streams with a short block so it stops quickly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio
import anyio.from_thread

import bus
from saga import App, EngineConfig, SagaWorker
from tests.ops.scenario import Scenario, app, drive

LIVE_CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000, block_ms=50))
APP_REF = "tests.ops.scenario:app"


@dataclass(frozen=True, slots=True)
class Live:
    """The Redis URL, the scenario's saga ids, and the environment a ``saga`` command needs."""

    url: str
    scenario: Scenario

    @property
    def ids(self) -> dict[str, str]:
        """A saga id per state."""
        return self.scenario.ids

    @property
    def env(self) -> dict[str, str]:
        """``REDSAGA_REDIS_URL``, ``REDSAGA_APP`` and ``REDSAGA_OPERATOR`` for the commands."""
        return {
            **os.environ,
            "REDSAGA_REDIS_URL": self.url,
            "REDSAGA_APP": APP_REF,
            "REDSAGA_OPERATOR": "alice@ops",
        }


def prepare(url: str) -> Scenario:
    """Flush the database and drive the scenario into it."""

    async def main() -> Scenario:
        redis = bus.connect(url)
        try:
            await redis.flushdb()
            return await drive(redis)
        finally:
            await redis.aclose()

    return anyio.run(main)


@contextmanager
def background_worker(
    url: str, worker_app: App, clock: bus.Clock, config: EngineConfig = LIVE_CONFIG
) -> Iterator[SagaWorker]:
    """Run ``worker_app``'s worker, on ``clock``, in a background thread until the block ends."""
    with anyio.from_thread.start_blocking_portal() as portal:

        async def build() -> tuple[bus.Redis, SagaWorker]:
            redis = bus.connect(url)
            return redis, SagaWorker(redis, worker_app, config=config, clock=clock, consumer="live")

        redis, worker = portal.call(build)
        running = portal.start_task_soon(worker.run)
        portal.call(worker.started.wait)
        try:
            yield worker
        finally:
            portal.call(worker.stop)
            running.result(timeout=30)
            portal.call(redis.aclose)


def flush(url: str) -> None:
    """Empty the test database: the scenario leaves sagas in flight that other suites (the
    demo, which waits for every saga of its context to end) must not find."""

    async def main() -> None:
        redis = bus.connect(url)
        try:
            await redis.flushdb()
        finally:
            await redis.aclose()

    anyio.run(main)


@contextmanager
def live_system(url: str) -> Iterator[Live]:
    """The scenario in Redis with an orchestrator deciding its inbox (flushed afterwards)."""
    scenario = prepare(url)
    try:
        with background_worker(url, app, scenario.clock):
            yield Live(url=url, scenario=scenario)
    finally:
        flush(url)
