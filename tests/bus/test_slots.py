"""The handler-slot pool: bounded, fair (first come, first served), cancellation-safe."""

from __future__ import annotations

import anyio
import pytest

from bus._slots import Slots

pytestmark = pytest.mark.anyio


async def test_reserve_takes_at_most_what_is_free() -> None:
    slots = Slots(5)
    assert await slots.reserve(3) == 3
    assert await slots.reserve(10) == 2
    assert slots.busy == 5


async def test_released_slots_go_to_the_oldest_waiter_before_anyone_else() -> None:
    slots = Slots(3)
    assert await slots.reserve(3) == 3
    got: list[int] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_reserve_into, slots, 2, got)
            await anyio.wait_all_tasks_blocked()
            slots.release(3)
            # granted at release time: a caller that comes straight back gets only the rest
            assert slots.free == 1
            assert await slots.reserve(3) == 1
    assert got == [2]


async def test_a_waiter_cancelled_around_its_grant_loses_no_slot() -> None:
    slots = Slots(1)
    await slots.reserve(1)
    got: list[int] = []
    scope = anyio.CancelScope()

    async def doomed() -> None:  # a caller that gives back what it got when cancelled
        with scope:
            granted = await slots.reserve(1)
            try:
                await anyio.sleep_forever()
            finally:
                slots.release(granted)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(_reserve_into, slots, 1, got)
            await anyio.wait_all_tasks_blocked()
            slots.release(1)  # granted to the first waiter…
            scope.cancel()  # …which is cancelled before or after it resumes
    assert got == [1]
    assert slots.free == 0


async def test_a_waiter_cancelled_before_its_grant_leaves_the_queue() -> None:
    slots = Slots(1)
    await slots.reserve(1)
    with anyio.move_on_after(0) as scope:
        await slots.reserve(1)
    assert scope.cancelled_caught
    slots.release(1)
    assert slots.free == 1


async def _reserve_into(slots: Slots, most: int, got: list[int]) -> None:
    got.append(await slots.reserve(most))
