"""The scope a handler runs in: cancelled from outside when its lease is lost, nothing else."""

from __future__ import annotations

import anyio
import pytest

from bus._delivery import HandlerScope

pytestmark = pytest.mark.anyio


async def test_cancel_from_another_task_stops_the_handler_and_is_swallowed() -> None:
    scope = HandlerScope()
    reached: list[str] = []

    async def handler() -> None:
        with scope:
            reached.append("started")
            await anyio.sleep_forever()
        reached.append("after the scope")
        await anyio.sleep(0)  # no cancellation is left pending on the task
        reached.append("still running")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(handler)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
    assert reached == ["started", "after the scope", "still running"]
    assert scope.cancel_called


async def test_cancel_from_inside_leaves_no_pending_cancellation() -> None:
    scope = HandlerScope()
    with anyio.fail_after(5):
        with scope:
            scope.cancel()  # what the worker does after a handler raised LeaseLost
        await anyio.sleep(0)
        await anyio.sleep(0)
    assert scope.cancel_called


async def test_an_outer_cancellation_at_the_same_time_still_takes_effect() -> None:
    scope = HandlerScope()
    reached: list[str] = []

    async def handler() -> None:
        with scope:
            await anyio.sleep_forever()
        # Like asyncio.timeout, the scope may swallow the one cancellation both asked for;
        # the outer scope's is delivered again at the next await.
        reached.append("after the scope")
        await anyio.sleep(0)
        reached.append("still running")  # must not run: the group was cancelled

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(handler)
            await anyio.wait_all_tasks_blocked()
            scope.cancel()
            group.cancel_scope.cancel()
    assert "still running" not in reached


async def test_an_outer_cancellation_alone_propagates() -> None:
    scope = HandlerScope()
    reached: list[str] = []

    async def handler() -> None:
        with scope:
            await anyio.sleep_forever()
        reached.append("after the scope")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(handler)
            await anyio.wait_all_tasks_blocked()
            group.cancel_scope.cancel()
    assert reached == []
    assert not scope.cancel_called


async def test_cancel_after_the_handler_finished_does_nothing() -> None:
    scope = HandlerScope()
    with scope:
        await anyio.sleep(0)
    scope.cancel()
    await anyio.sleep(0)  # not cancelled
    assert scope.cancel_called


async def test_cancel_from_inside_stops_the_handler_at_its_next_await() -> None:
    scope = HandlerScope()
    reached: list[str] = []
    with anyio.fail_after(5):
        with scope:
            scope.cancel()  # a heartbeat made by the handler found the lease lost…
            reached.append("goes on")  # …and the handler ignored the LeaseLost it raised
            await anyio.sleep(1)
            reached.append("not reached")
        await anyio.sleep(0)  # the task itself is not cancelled afterwards
    assert reached == ["goes on"]
