"""The order generator compose runs: one order per tick of its clock, a clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

import bus
from redsaga.examples.generator import OrderGenerator
from redsaga.examples.orders import app as orders_app
from saga import SagaClient
from tests.helpers import eventually

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


class ParkingClock(bus.FakeClock):
    """A fake clock that counts the sleeps not yet due, so a test can wait for a loop to park."""

    def __init__(self) -> None:
        super().__init__()
        self._deadlines: list[int] = []

    @property
    def parked(self) -> int:
        return sum(1 for deadline in self._deadlines if deadline > self.now_ms())

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._deadlines.append(self.now_ms() + int(seconds * 1000))
        await super().sleep(seconds)


async def saga_ids(redis: bus.Redis) -> set[str]:
    """The ids of every order-fulfilment saga in Redis (from their state hashes)."""
    keys = [key.decode() async for key in redis.scan_iter(match="rs:{orders:*}:saga:*")]
    return {key.rsplit(":saga:", 1)[1] for key in keys}


async def test_one_order_per_tick_until_stopped(redis: bus.Redis) -> None:
    clock = ParkingClock()
    generator = OrderGenerator(SagaClient(redis, orders_app.registry), every_s=5, seed=1, clock=clock)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(generator.run)
        await eventually(lambda: generator.started == 1, 5, "the first order starts at once")
        for expected in (2, 3):
            await eventually(lambda: clock.parked == 1, 5, "the generator waits for its next tick")
            assert generator.started == expected - 1  # nothing more until the clock moves
            clock.advance(5)
            await eventually(lambda e=expected: generator.started == e, 5, f"order {expected} starts")
        await eventually(lambda: clock.parked == 1, 5, "the generator waits again")
        generator.stop()  # during the pause: it ends without waiting for the tick
    assert generator.started == 3
    ids = await saga_ids(redis)
    assert len(ids) == 3
    assert all(i.startswith(f"order-gen-{generator.run_id}-") for i in ids)


async def test_a_start_that_failed_for_now_is_tried_again_with_the_same_order(redis: bus.Redis) -> None:
    client = SagaClient(redis, orders_app.registry)
    tried: list[str] = []
    real_start = client.start

    async def flaky_start(definition: object, data: object, *, saga_id: str) -> str:
        tried.append(saga_id)
        if len(tried) == 1:
            raise bus.RedisUnavailable("connection refused")
        return await real_start(definition, data, saga_id=saga_id)  # type: ignore[arg-type]

    client.start = flaky_start  # type: ignore[method-assign]
    clock = ParkingClock()
    generator = OrderGenerator(client, every_s=1, limit=2, clock=clock)
    done = anyio.Event()

    async def run() -> None:
        await generator.run()
        done.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(run)
        while not done.is_set():
            await eventually(lambda: clock.parked == 1 or done.is_set(), 5, "the generator waits or ends")
            clock.advance(1)
    assert tried[0] == tried[1]  # the failed order again, under the same id
    assert generator.started == 2
    assert len(await saga_ids(redis)) == 2


async def test_a_generator_needs_a_positive_period(redis: bus.Redis) -> None:
    with pytest.raises(ValueError, match="positive"):
        OrderGenerator(SagaClient(redis, orders_app.registry), every_s=0)


@pytest.mark.redis
async def test_the_process_starts_orders_until_sigterm_and_exits_cleanly(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    env = {**os.environ, bus.URL_ENV: real_redis_url}
    process = subprocess.Popen(
        [sys.executable, "-m", "redsaga.examples.generator", "--every", "0.05"],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        async def at_least_three() -> bool:
            return len(await saga_ids(real_redis)) >= 3

        await eventually(at_least_three, 30, "the generator has started three orders")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    lines = [json.loads(line) for line in stderr.splitlines()]
    assert lines[-1]["event"] == "generator stopped"
    started = [line["saga_id"] for line in lines if line["event"] == "order started"]
    assert lines[-1]["started"] == len(started) == len(await saga_ids(real_redis))
    assert set(started) == await saga_ids(real_redis)


def test_without_a_redis_url_it_refuses_with_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != bus.URL_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "redsaga.examples.generator"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: the generator starts orders on a real Redis: pass --redis-url or set {bus.URL_ENV}"
    ]


async def test_orders_above_the_approval_limit_wait_for_a_manager(redis: bus.Redis) -> None:
    """Some generated orders run large_order, so the system shows human tasks too."""
    client = SagaClient(redis, orders_app.registry)
    clock = ParkingClock()
    generator = OrderGenerator(client, every_s=1, seed=7, limit=6, clock=clock)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(generator.run)
        for started in range(1, 6):
            await eventually(lambda n=started: generator.started == n, 5, f"order {started} starts")
            await eventually(lambda: clock.parked == 1, 5, "the generator waits for its next tick")
            clock.advance(1)
    assert generator.started == 6
    ours = sorted(i for i in await saga_ids(redis) if i.startswith(f"order-gen-{generator.run_id}-"))
    definitions = [(await client.get(i)).name for i in ours]
    assert definitions.count("large_order") == 2  # seed 7 draws two totals above the limit
    assert definitions.count("order_fulfilment") == 4
