"""A real rate on a real clock: 50 commands a second through three worker processes.

The engine's own speed is never asserted on; the rate the participant saw is the point: each
effect is recorded once with the time the participant ran it, and the rate is measured from
those records over 30 s (1,500 commands and more, all queued at once, so the limit is what
holds them back the whole time).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import bus
from saga import SagaClient, SagaStatus
from tests.faults.procs import Procs, owned
from tests.flow.rate_app import BURST, URL_ENV, Job, app, rated
from tests.helpers import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis, pytest.mark.slow]
RATE = 50
WINDOW_S = 30
SAGAS = RATE * WINDOW_S + 150  # the limit is saturated for the whole window


async def ended(client: SagaClient) -> int:
    return sum(n for (_, status), n in (await client.counts()).items() if SagaStatus(status).terminal)


@pytest.mark.timeout(240)
async def test_50_per_second_holds_within_5_percent_over_30_seconds_with_3_workers(
    real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
) -> None:
    with owned(Procs("tests.flow.rate_app", tmp_path / "logs", {URL_ENV: real_redis_url})) as procs:
        for n in range(3):
            await procs.start(f"worker-{n}")
        client = SagaClient(real_redis, app().registry)

        async def start(first: int) -> None:
            for n in range(first, SAGAS, 20):
                await client.start(rated, Job(id=f"j{n}"), saga_id=f"j{n}")

        async with anyio.create_task_group() as group:
            for first in range(20):
                group.start_soon(start, first)
        await eventually(lambda: _at_least(client, SAGAS), 120, "every saga ended", poll=0.5)

    calls = sorted(int(t) for t in await real_redis.lrange("test:calls", 0, -1))
    assert len(calls) == SAGAS  # each effect once
    first = calls[0]
    in_window = [t for t in calls if t < first + WINDOW_S * 1_000_000_000]
    measured = (len(in_window) - BURST) / WINDOW_S  # the burst goes at once, the rest at the rate
    per_second = [
        sum(1 for t in calls if first + s * 10**9 <= t < first + (s + 1) * 10**9) for s in range(WINDOW_S)
    ]
    assert RATE * 0.95 <= measured <= RATE * 1.05, (measured, per_second)
    # no second of it goes over the limit by more than 5% (the burst aside)
    assert max(per_second[1:]) <= RATE * 1.05 + 1, per_second
    assert per_second[0] <= RATE + BURST + 1, per_second


async def _at_least(client: SagaClient, n: int) -> bool:
    return await ended(client) >= n
