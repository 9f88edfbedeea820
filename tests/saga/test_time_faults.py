"""Fault catalogue item 19 and the durability of timers, on real Redis processes.

- SIGKILL the timer scheduler while it fires: every timer fires exactly once (each firing is
  one script: all of a batch or none of it), and each saga's effect happens once.
- A Redis restart with AOF loses no timer, no schedule and no wait.
- A worker whose clock jumps forwards or backwards fires nothing early and nothing late:
  Redis ``TIME`` judges every timer.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

import bus
from bus import FakeClock, SystemClock
from saga import App, EngineConfig, SagaClient, SagaStatus, SagaWorker
from saga.core.history_entry import HistoryEntry
from saga.core.model import TimerFired
from saga.store.keys import Partition, partition_of
from saga.store.redis_store import RedisStore
from tests.faults.servers import PrivateRedis
from tests.saga.nap_sagas import NAPS, Nap, nap, recorder

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]
PARTITIONS = [Partition(NAPS.name, i) for i in range(NAPS.partitions)]
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000, concurrency=128, read_batch=100))


async def inbox_total(redis: bus.Redis) -> int:
    return sum([await redis.xlen(p.inbox.key) for p in PARTITIONS])


async def pending_timers(redis: bus.Redis) -> int:
    return sum([await redis.zcard(p.timers) for p in PARTITIONS])


async def redis_now(redis: bus.Redis) -> datetime:
    seconds, micros = await redis.time()
    return datetime.fromtimestamp(int(seconds) + int(micros) / 1e6, tz=UTC)


def spawn_scheduler(url: str, log: Path, batch: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TIMER_REDIS_URL": url, "TIMER_BATCH": str(batch)}
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.saga.timer_proc"], env=env, stdout=sink, stderr=sink
        )


async def histories(redis: bus.Redis, saga_id: str) -> list[HistoryEntry]:
    partition = Partition(NAPS.name, partition_of(saga_id, NAPS.partitions))
    return await RedisStore(redis, ttl_ms=0, cap=0).history(partition, saga_id)


async def test_sigkill_the_scheduler_mid_firing_every_timer_fires_once(
    real_redis: bus.Redis, real_redis_url: str, tmp_path: Path
) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "0")) or None)
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    count = 4000
    app = App("naps", sagas=[nap], participants=[recorder(real_redis)])
    client = SagaClient(real_redis, app.registry, config=CONFIG)
    past = (await redis_now(real_redis) - timedelta(minutes=1)).isoformat()
    ids = [f"n{i}" for i in range(count)]
    async with anyio.create_task_group() as tg:  # sleeps until a minute ago: all due at once
        for chunk in range(8):

            async def start(part: list[str]) -> None:
                for saga_id in part:
                    await client.start(nap, Nap(id=saga_id, until=past), saga_id=saga_id)

            tg.start_soon(start, ids[chunk::8])
    assert await pending_timers(real_redis) == count

    log = tmp_path / "schedulers.log"
    first = spawn_scheduler(real_redis_url, log, batch=rng.choice([5, 10, 25]))
    others: list[subprocess.Popen[bytes]] = []
    try:
        target = rng.uniform(0.1, 0.7) * count
        with anyio.fail_after(60):
            while await inbox_total(real_redis) < target:
                await anyio.sleep(0.002)
        first.send_signal(signal.SIGKILL)
        first.wait()
        fired, left = await inbox_total(real_redis), await pending_timers(real_redis)
        assert fired + left == count, f"seed {seed}: {fired} fired + {left} left != {count}"
        assert left > 0, f"seed {seed}: the kill came after every timer had fired"
        others = [spawn_scheduler(real_redis_url, log, batch=50) for _ in range(2)]  # two at once
        with anyio.fail_after(60):
            while await pending_timers(real_redis):
                await anyio.sleep(0.01)
    finally:
        for process in (first, *others):
            if process.poll() is None:
                process.kill()
                process.wait()
    assert await inbox_total(real_redis) == count, f"seed {seed}: a timer fired twice"

    worker = SagaWorker(real_redis, app, config=CONFIG, clock=SystemClock(), consumer="after")
    with anyio.fail_after(120):
        await worker.run_until_idle()
    effects = [e.decode() for e in await real_redis.lrange("test:effects", 0, -1)]
    assert sorted(effects) == sorted(f"{i}:record:do" for i in ids), f"seed {seed}"
    for saga_id in rng.sample(ids, 50):
        history = await histories(real_redis, saga_id)
        wakes = [h for h in history if isinstance(h.event, TimerFired) and not h.ignored]
        assert len(wakes) == 1, f"seed {seed}: {saga_id}"
        assert history[-1].status == SagaStatus.COMPLETED


class SkewedClock(SystemClock):
    """A worker clock that is wrong by ``offset_ms``; scripts still use Redis TIME."""

    def __init__(self, offset_ms: int) -> None:
        self.offset_ms = offset_ms

    def now_ms(self) -> int:
        return super().now_ms() + self.offset_ms


@pytest.mark.parametrize("offset", [timedelta(days=2), -timedelta(days=2)], ids=["forwards", "backwards"])
async def test_a_worker_clock_jump_never_fires_a_timer_early_or_late(
    real_redis: bus.Redis, offset: timedelta
) -> None:
    clock = SkewedClock(int(offset.total_seconds() * 1000))
    app = App("naps", sagas=[nap], participants=[recorder(real_redis)])
    client = SagaClient(real_redis, app.registry, clock=clock, config=CONFIG)
    worker = SagaWorker(real_redis, app, config=CONFIG, clock=clock, consumer="skewed")
    now = await redis_now(real_redis)
    await client.start(nap, Nap(id="relative", seconds=3600), saga_id="relative")  # one hour by Redis
    await client.start(
        nap, Nap(id="absolute", until=(now + timedelta(hours=1)).isoformat()), saga_id="absolute"
    )
    await client.start(nap, Nap(id="due", until=(now - timedelta(seconds=1)).isoformat()), saga_id="due")
    await worker.run_until_idle()
    assert (await client.get("due")).status == SagaStatus.COMPLETED  # due by Redis: fired (not late)
    for saga_id in ("relative", "absolute"):
        assert (await client.get(saga_id)).status == SagaStatus.SUSPENDED  # not due by Redis: not early
    scores = [int(s) for _, s in await real_redis.zrange(PARTITIONS[0].timers, 0, -1, withscores=True)]
    scores += [
        int(s) for p in PARTITIONS[1:] for _, s in await real_redis.zrange(p.timers, 0, -1, withscores=True)
    ]
    redis_ms = int(now.timestamp() * 1000)
    assert all(abs(s - (redis_ms + 3_600_000)) < 5_000 for s in scores), scores  # due an hour from Redis' now


# -- Redis restarts with AOF --------------------------------------------------------------


async def test_timers_schedules_and_waits_survive_a_redis_restart_with_aof(aof_redis: PrivateRedis) -> None:
    from saga import ScheduleClient
    from tests.saga.report_sagas import MIDNIGHT, every_minute, report
    from tests.saga.time_sagas import Approval, Loan, loan, participants

    clock = FakeClock(int(MIDNIGHT.timestamp() * 1000))
    config = EngineConfig(bus=bus.BusConfig(lease_ms=10_000), signal_secret="a secret of sixteen+ bytes")
    effects: list[tuple[str, str]] = []
    tokens: list[str] = []

    def world(redis: bus.Redis) -> tuple[SagaWorker, SagaClient, ScheduleClient, SagaWorker]:
        naps = App("naps", sagas=[nap], participants=[recorder(redis)])
        lending = App("lending", sagas=[loan, report], participants=participants(effects, tokens))
        return (
            SagaWorker(redis, naps, config=config, clock=clock),
            SagaClient(redis, lending.registry, clock=clock, config=config),
            ScheduleClient(redis, "reports", registry=lending.registry, clock=clock),
            SagaWorker(redis, lending, config=config, clock=clock),
        )

    redis = bus.connect(aof_redis.url)
    naps_worker, client, schedules, lending_worker = world(redis)
    nap_client = SagaClient(redis, naps_worker.app.registry, clock=clock, config=config)
    for n in range(100):
        await nap_client.start(nap, Nap(id=f"n{n}", seconds=600 + n), saga_id=f"n{n}")
    await client.start(loan, Loan(id="L1", amount=5), saga_id="L1")
    await schedules.create(every_minute(overlap="skip"))
    await naps_worker.run_until_idle()
    await lending_worker.run_until_idle()
    assert await pending_timers(redis) == 100
    await redis.aclose()

    aof_redis.kill()  # no shutdown, no final save: only what AOF has
    await aof_redis.start()

    redis = bus.connect(aof_redis.url)
    naps_worker, client, schedules, lending_worker = world(redis)  # workers restart too
    assert await pending_timers(redis) == 100
    assert (await schedules.get("minutely")).state.started == 1
    await client.signal(tokens[0], Approval(approved=True, by="ann"))
    clock.advance(700)
    await naps_worker.run_until_idle()
    await lending_worker.run_until_idle()
    nap_client = SagaClient(redis, naps_worker.app.registry, clock=clock, config=config)
    assert [(await nap_client.get(f"n{n}")).status for n in range(100)] == [SagaStatus.COMPLETED] * 100
    assert len(await redis.lrange("test:effects", 0, -1)) == 100
    loan_state = await client.get("L1", context="lending")
    assert loan_state.wait is not None
    assert loan_state.wait.step == "cool_off"  # approved after the restart, now sleeping an hour
    clock.advance(3600)
    await lending_worker.run_until_idle()
    loan_state = await client.get("L1", context="lending")
    assert loan_state.wait is not None
    assert loan_state.wait.step == "funds"
    assert (await schedules.get("minutely")).state.started > 1  # the schedule kept firing
    await redis.aclose()
