"""A real rate on a real clock: 50 commands a second through three worker processes.

The engine's own speed is never asserted on; the rate the participant saw is the point: each
effect is recorded once with the time the participant ran it, and the rate is measured from
those records over 30 s (1,500 commands and more, all queued at once, so the limit is what
holds them back the whole time). On one Redis and on a 6-node cluster, where the limit's
bucket lives in one slot and the sagas' partitions in others.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import bus
from saga import SagaClient, SagaStatus
from tests.cluster import LocalCluster
from tests.faults.procs import Procs, owned
from tests.flow.rate_app import BURST, CALLS, URL_ENV, Job, app, rated
from tests.helpers import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.slow]
RATE = 50
WINDOW_S = 30
SAGAS = RATE * WINDOW_S + 150  # the limit is saturated for the whole window


async def ended(client: SagaClient) -> int:
    return sum(n for (_, status), n in (await client.counts()).items() if SagaStatus(status).terminal)


async def run_rated(redis: bus.Redis, url: str, logs: Path) -> None:
    """Queue every saga at once through three workers, then check the rate the participant saw."""
    with owned(Procs("tests.flow.rate_app", logs, {URL_ENV: url})) as procs:
        for n in range(3):
            await procs.start(f"worker-{n}")
        client = SagaClient(redis, app().registry)

        async def start(first: int) -> None:
            for n in range(first, SAGAS, 20):
                await client.start(rated, Job(id=f"j{n}"), saga_id=f"j{n}")

        async with anyio.create_task_group() as group:
            for first in range(20):
                group.start_soon(start, first)
        await eventually(lambda: _at_least(client, SAGAS), 120, "every saga ended", poll=0.5)

    calls = sorted(int(t) for t in await redis.lrange(CALLS, 0, -1))
    assert len(calls) == SAGAS  # each effect once
    first = calls[0]
    in_window = [t for t in calls if t < first + WINDOW_S * 1_000_000_000]
    measured = (len(in_window) - BURST) / WINDOW_S  # the burst goes at once, the rest at the rate
    per_second = [
        sum(1 for t in calls if first + s * 10**9 <= t < first + (s + 1) * 10**9) for s in range(WINDOW_S)
    ]
    assert RATE * 0.95 <= measured <= RATE * 1.05, (measured, per_second)
    # no second of it goes over what a token bucket allows: the rate, plus the tokens saved
    # while commands came late (at most the burst; a loaded machine delays some of them)
    assert max(per_second[1:]) <= RATE * 1.05 + BURST, per_second
    assert per_second[0] <= RATE + BURST + 1, per_second


async def _at_least(client: SagaClient, n: int) -> bool:
    return await ended(client) >= n


@pytest.mark.redis
@pytest.mark.timeout(240)
async def test_50_per_second_holds_within_5_percent_over_30_seconds_with_3_workers(
    real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
) -> None:
    await run_rated(real_redis, real_redis_url, tmp_path / "logs")


@pytest.mark.cluster
@pytest.mark.timeout(240)
async def test_50_per_second_holds_on_a_cluster_too(
    cluster: LocalCluster, cluster_redis: bus.Redis, tmp_path: Path
) -> None:
    await run_rated(cluster_redis, cluster.url, tmp_path / "logs")
