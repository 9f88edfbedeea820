"""Crash test on real Redis: SIGKILL a worker with fan-out sagas in flight and compensating.

Fault catalogue item 23 (docs/faults.md) for groups: whatever moment the worker dies at -- branches in
flight, a group closing, compensation half way -- a second worker finishes every saga, no
effect is applied twice, and compensation undoes exactly the completed steps and branches,
in strict reverse order of completion (G3).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

import bus
from saga import SagaClient, SagaState, SagaStatus
from saga.testing import decode_history
from tests.faults.procs import Procs, owned
from tests.helpers import eventually
from tests.saga.fan_crash_app import URL_ENV, FanJob, app, fan_crash

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]
SAGAS = 80


async def ended(client: SagaClient) -> int:
    return sum(n for (_, status), n in (await client.counts()).items() if SagaStatus(status).terminal)


def expected(job: FanJob, state: SagaState) -> tuple[set[str], list[str]]:
    """The keys done, and the keys undone in order, for the saga's end (from its records)."""
    branches = sorted((record.seq, key) for key, record in state.branches.items() if record.seq > 0)
    completed = ["one", *(key for _, key in branches)] + (["last"] if "last" in state.completed else [])
    done = {f"{job.id}:{k}:do" for k in completed}
    if state.status == SagaStatus.COMPLETED:
        return done, []
    return done, [f"{job.id}:{k}:undo" for k in reversed(completed)]


async def test_sigkill_with_fan_out_sagas_in_flight_undoes_exactly_the_completed_branches_in_reverse(
    real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "0")) or None)
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    client = SagaClient(real_redis, app.registry)
    jobs = []
    for n in range(SAGAS):
        fault = rng.choice(["none", "none", "item", "last"])
        jobs.append(
            FanJob(
                id=f"fan-{n}",
                fail_item=rng.randrange(12) if fault == "item" else -1,
                fail_last=fault == "last",
            )
        )
    with owned(Procs("tests.saga.fan_crash_app", tmp_path / "logs", {URL_ENV: real_redis_url})) as procs:
        first = procs.spawn("first")
        for job in jobs:
            await client.start(fan_crash, job, saga_id=job.id)
        kill_at = rng.randrange(SAGAS // 10, SAGAS // 2)

        async def at_least(n: int) -> bool:
            return await ended(client) >= n

        await eventually(lambda: at_least(kill_at), 60, f"{kill_at} sagas ended", poll=0.002)
        first.kill()
        assert await ended(client) < SAGAS, f"seed {seed}: the kill came too late to test anything"
        procs.spawn("second")
        await eventually(lambda: at_least(SAGAS), 120, "every saga ended")

    effects = [e.decode() for e in await real_redis.lrange("test:effects", 0, -1)]
    assert len(effects) == len(set(effects)), f"seed {seed}: an effect was applied twice"
    for job in jobs:
        state = await client.get(job.id)
        failing = job.fail_item >= 0 or job.fail_last
        assert state.status == (SagaStatus.COMPENSATED if failing else SagaStatus.COMPLETED), (seed, job)
        done, undone = expected(job, state)
        mine = [e for e in effects if e.startswith(f"{job.id}:")]
        assert {e for e in mine if e.endswith(":do")} == done, (seed, job.id)
        assert [e for e in mine if e.endswith(":undo")] == undone, (seed, job.id)
        raw = await real_redis.lrange(f"rs:{{fancrashctx:0}}:hist:{job.id}", 0, -1)
        history = decode_history(raw, state=state)  # the saga has ended: its state is as new
        revisions = [h.revision for h in history if not h.ignored]
        assert revisions == list(range(1, len(revisions) + 1)), (seed, job.id, revisions)
