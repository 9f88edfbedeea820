"""SIGTERM/SIGINT handling of a worker process (signals sent to this very process)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import anyio
import msgspec
import pytest

import bus
from bus import Bus, BusConfig, Publisher, Stream, Worker
from tests.helpers import pending

pytestmark = pytest.mark.anyio

JOBS = Stream.named("jobs")


class Job(msgspec.Struct, tag=True):
    n: int


def gated_app(gate: anyio.Event, started: list[int], done: list[int]) -> Bus:
    app = Bus("jobs")

    @app.handler(JOBS, Job)
    async def run(job: Job) -> None:
        started.append(job.n)
        await gate.wait()
        done.append(job.n)

    return app


async def wait_until(check: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not check():
            await anyio.sleep(0.01)  # polling for an observable state, not for timing


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_first_signal_drains_in_flight_work_then_returns(fake_redis: bus.Redis, signum: int) -> None:
    gate, started, done = anyio.Event(), [], []
    worker = Worker(fake_redis, gated_app(gate, started, done), config=BusConfig(block_ms=50))
    for n in range(3):
        await Publisher(fake_redis).publish(JOBS, Job(n=n))
    with anyio.fail_after(5):  # serve() returns: the signal stopped the worker
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.serve)
            await worker.started.wait()
            await wait_until(lambda: len(started) == 3)
            os.kill(os.getpid(), signum)
            await anyio.wait_all_tasks_blocked()
            gate.set()  # in-flight handlers may finish after the signal
    assert sorted(done) == [0, 1, 2]
    assert await pending(fake_redis, JOBS, "jobs") == []


async def test_second_signal_stops_at_once_and_leaves_entries_pending(fake_redis: bus.Redis) -> None:
    gate, started, done = anyio.Event(), [], []
    worker = Worker(fake_redis, gated_app(gate, started, done), config=BusConfig(block_ms=50))
    await Publisher(fake_redis).publish(JOBS, Job(n=1))
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.serve)
            await worker.started.wait()
            await wait_until(lambda: started == [1])
            os.kill(os.getpid(), signal.SIGTERM)
            await anyio.wait_all_tasks_blocked()
            os.kill(os.getpid(), signal.SIGTERM)
    assert done == []  # the handler was cancelled, never finished
    [entry] = await pending(fake_redis, JOBS, "jobs")  # left for another worker: nothing lost
    assert entry["consumer"] == worker.consumer
