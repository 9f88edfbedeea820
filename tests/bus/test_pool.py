"""The handler pool: reused tasks, one job per task at a time, closed cleanly."""

from __future__ import annotations

import anyio
import pytest

from bus._pool import HandlerPool

pytestmark = pytest.mark.anyio


async def test_jobs_handed_over_back_to_back_still_run_concurrently() -> None:
    gate = anyio.Event()
    running: list[int] = []

    async def job(n: int) -> None:
        running.append(n)
        await gate.wait()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            with HandlerPool(group, 4) as pool:
                pool.start(job, 0)
                await anyio.wait_all_tasks_blocked()
                gate.set()
                await anyio.wait_all_tasks_blocked()  # the task is idle again, and reused below
                gate = anyio.Event()
                pool.start(job, 1)
                pool.start(job, 2)  # must not queue behind job 1 on the same task
                await anyio.wait_all_tasks_blocked()
                assert sorted(running) == [0, 1, 2]
                gate.set()


async def test_more_jobs_than_the_pool_size_each_get_a_task() -> None:
    gate = anyio.Event()
    running: list[int] = []

    async def job(n: int) -> None:
        running.append(n)
        await gate.wait()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            with HandlerPool(group, 2) as pool:
                for n in range(5):
                    pool.start(job, n)
                await anyio.wait_all_tasks_blocked()
                assert sorted(running) == [0, 1, 2, 3, 4]
                gate.set()


async def test_closing_ends_idle_tasks_and_lets_busy_ones_finish() -> None:
    gate = anyio.Event()
    done: list[int] = []

    async def job(n: int) -> None:
        if n:
            await gate.wait()
        done.append(n)

    with anyio.fail_after(5):  # the group exits: no pool task is left waiting for work
        async with anyio.create_task_group() as group:
            with HandlerPool(group, 4) as pool:
                pool.start(job, 0)
                pool.start(job, 1)
                await anyio.wait_all_tasks_blocked()
            gate.set()
    assert done == [0, 1]


async def test_cancelling_the_group_cancels_running_jobs() -> None:
    finished: list[int] = []

    async def job(n: int) -> None:
        await anyio.sleep_forever()
        finished.append(n)

    async with anyio.create_task_group() as group:
        with HandlerPool(group, 2) as pool:
            pool.start(job, 1)
            await anyio.wait_all_tasks_blocked()
            group.cancel_scope.cancel()
    assert finished == []
