"""Crash test on real Redis: SIGKILL the worker with 500 sagas in flight, start another."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

import bus
from saga import HistoryEntry, SagaClient, SagaStatus
from tests.saga.crash_app import STEPS, Job, app, crash

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]
SAGAS = 500


def spawn_worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CRASH_REDIS_URL": url}
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.saga.crash_app"], env=env, stdout=sink, stderr=sink
        )


async def ended(client: SagaClient) -> int:
    return sum(n for (_, status), n in (await client.counts()).items() if SagaStatus(status).terminal)


def expected_effects(job: Job, status: SagaStatus) -> list[str]:
    """The idempotency keys that must have taken effect, in order, for a saga's end state."""
    if status == SagaStatus.COMPLETED:
        return [f"{job.id}:{s}:do" for s in STEPS]
    done = list(STEPS[: STEPS.index(job.fail_at)])
    return [f"{job.id}:{s}:do" for s in done] + [f"{job.id}:{s}:undo" for s in reversed(done)]


async def test_sigkill_with_500_sagas_in_flight_loses_nothing_and_applies_nothing_twice(
    real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "0")) or None)
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    client = SagaClient(real_redis, app.registry)
    jobs = [Job(id=f"job-{n}", fail_at=rng.choice(["", "", "", "two", "three"])) for n in range(SAGAS)]
    log = tmp_path / "workers.log"
    first = spawn_worker(real_redis_url, log)
    second = None
    try:
        for job in jobs:
            await client.start(crash, job, saga_id=job.id)
        # kill it when a random share of the sagas has ended: a random moment mid-flight
        kill_at = rng.randrange(SAGAS // 10, SAGAS // 2)
        with anyio.fail_after(30):
            while await ended(client) < kill_at:
                await anyio.sleep(0.002)  # polling an observable count, not waiting for time
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert await ended(client) < SAGAS, f"seed {seed}: the kill came too late to test anything"
        second = spawn_worker(real_redis_url, log)
        with anyio.fail_after(90):
            while await ended(client) < SAGAS:
                await anyio.sleep(0.05)  # polling an observable count
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()

    effects = [e.decode() for e in await real_redis.lrange("test:effects", 0, -1)]
    assert len(effects) == len(set(effects)), f"seed {seed}: an effect was applied twice"
    applied = set(effects)
    for job in jobs:
        state = await client.get(job.id)
        expected_end = SagaStatus.COMPLETED if not job.fail_at else SagaStatus.COMPENSATED
        assert state.status == expected_end, f"seed {seed}: {job.id} ended {state.status}"
        mine = [e for e in effects if e.startswith(f"{job.id}:")]
        assert mine == expected_effects(job, state.status), f"seed {seed}: {job.id} effects {mine}"
        history = [
            msgspec.json.decode(raw, type=HistoryEntry)
            for raw in await real_redis.lrange(f"rs:{{crashctx:0}}:hist:{job.id}", 0, -1)
        ]
        revisions = [h.revision for h in history if not h.ignored]
        assert revisions == list(range(1, len(revisions) + 1)), f"seed {seed}: {job.id} revisions {revisions}"
        assert history[-1].status.terminal
    runs = [int(await real_redis.get(f"test:runs:{key}") or 0) for key in applied]
    assert all(r >= 1 for r in runs)
