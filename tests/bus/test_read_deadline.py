"""The lean path's read timeout: one timer per connection, moved per read (bus/_deadline.py).

It must still time a read out as redis-py's ``TimeoutError`` (which the retry policy
handles), leave any other cancellation a cancellation, and drop the connection either way.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest
from redis import exceptions as rx

import bus
from bus._connection import send_batch
from bus._deadline import ReadDeadline

pytestmark = pytest.mark.anyio

NOBODY_PUSHES = "read-deadline-test:nobody-pushes-here"


async def test_a_read_past_the_socket_timeout_is_redis_pys_timeout_and_the_next_read_works(
    real_redis_url: str,
) -> None:
    client = bus.connect(real_redis_url, bus.ClientConfig(socket_timeout_s=0.3, retries=0))
    try:
        with pytest.raises(rx.TimeoutError, match="Timeout reading from"):
            await send_batch(client, [("BLPOP", NOBODY_PUSHES, 5)])
        assert await send_batch(client, [("PING",)]) == [True]  # a new connection, not the cut one
    finally:
        await client.aclose()


async def test_a_cancelled_read_stays_a_cancellation_and_its_connection_is_dropped(
    real_redis_url: str,
) -> None:
    client = bus.connect(real_redis_url, bus.ClientConfig(socket_timeout_s=5.0, retries=0))
    try:
        with anyio.move_on_after(0.1) as scope:
            await send_batch(client, [("BLPOP", NOBODY_PUSHES, 2)])
        assert scope.cancelled_caught
        # the BLPOP's reply would still be on a reused connection: PING must get its own
        assert await send_batch(client, [("PING",)]) == [True]
        assert await send_batch(client, [("ECHO", "x")]) == [b"x"]
    finally:
        await client.aclose()


async def test_reads_within_the_timeout_schedule_one_timer_not_one_each() -> None:
    loop = asyncio.get_running_loop()
    scheduled: list[float] = []
    call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        scheduled.append(when)
        return call_at(when, callback, *args)

    deadline = ReadDeadline()
    loop.call_at = counting_call_at  # type: ignore[method-assign,assignment]
    try:
        for _ in range(100):
            deadline.arm(30.0)
            await asyncio.sleep(0)  # a read that yields once
            deadline.disarm()
    finally:
        del loop.call_at
    assert len(scheduled) == 1


async def test_a_passed_deadline_cancels_the_armed_task_and_says_so() -> None:
    deadline = ReadDeadline()

    async def read_that_never_returns() -> tuple[bool, int]:
        deadline.arm(0.01)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return deadline.passed(), asyncio.current_task().cancelling()  # type: ignore[union-attr]
        finally:
            deadline.disarm()
        raise AssertionError("the read returned")

    # bounded: a deadline that never fires fails here instead of hanging the suite
    passed, cancelling = await asyncio.wait_for(asyncio.create_task(read_that_never_returns()), 5)
    assert passed
    assert cancelling == 0  # the cancellation was taken back


async def test_a_moved_deadline_is_checked_again_when_the_first_timer_fires() -> None:
    deadline = ReadDeadline()
    deadline.arm(0.02)
    deadline.disarm()
    deadline.arm(60.0)  # the pending timer fires at 0.02 s, finds 60 s, and waits again
    with anyio.move_on_after(0.2) as scope:  # anyio's own cancellation, not the deadline's
        await asyncio.Event().wait()
    assert scope.cancelled_caught
    assert not deadline.passed()
    deadline.disarm()


async def test_a_deadline_disarmed_before_its_timer_fires_cancels_nothing() -> None:
    deadline = ReadDeadline()
    deadline.arm(0.01)
    deadline.disarm()
    waited = asyncio.Event()
    asyncio.get_running_loop().call_later(0.1, waited.set)
    await waited.wait()  # not cancelled by the timer that fired at 0.01 s
