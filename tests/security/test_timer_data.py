"""A pending timer's signed firing on a real ``redis-server`` with the example's generated ACL
users: only the orchestrator, which fires timers, reads it; the read-only operator's
``inspect`` still shows each pending timer (from its id and due time); and what an earlier
release stored under the partition's public prefix is moved, not lost, when timers fire.
"""

from __future__ import annotations

import pytest

from redsaga.examples import stateless
from saga.ops.admin import SagaAdmin
from saga.runtime.timer_firing import fire_round
from tests.security.test_attacks import ORDER, ORDERS, World, refused, world

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
__all__ = ["world"]
LEGACY = "rs:{orders:0}:timerdata"  # where an earlier release kept the partition's timer data


async def test_the_operator_reads_no_pending_timers_signed_firing(world: World) -> None:
    timer_id = (await world.state()).steps["reserve_stock"].timer
    assert timer_id is not None  # the attempt's timeout, due in 30 s
    assert await world.users.admin.hget(ORDERS.timer_data, timer_id)  # it is stored
    operator = world.users.client("redsaga.operator")
    await refused(operator.hget(ORDERS.timer_data, timer_id))
    await refused(operator.hgetall(ORDERS.timer_data))
    [timer] = (await SagaAdmin(operator, stateless.app).inspect(ORDER.id)).timers
    assert (timer.timer_id, timer.purpose, timer.step, timer.kind, timer.attempt) == (
        timer_id, "timeout", "reserve_stock", "do", 1,
    )  # fmt: skip
    assert timer.due_ms == await operator.zscore(ORDERS.timers, timer_id)


async def test_timer_data_an_earlier_release_left_public_is_moved_and_fires(world: World) -> None:
    admin = world.users.admin
    timer_id = (await world.state()).steps["reserve_stock"].timer
    assert timer_id is not None
    stored = await admin.hget(ORDERS.timer_data, timer_id)
    await admin.delete(ORDERS.timer_data)  # as an earlier release stored it, with a leftover
    await admin.hset(LEGACY, mapping={timer_id: stored, "o-gone:x:do:1:timeout": b"1:x[]"})
    await admin.zadd(ORDERS.timers, {timer_id: 0})  # due now
    orchestrator = world.users.client("redsaga.orders")  # the timers' firing is its own
    fired = await fire_round(orchestrator, [ORDERS], world.workers["redsaga.orders"].clock, 10)
    assert fired.fired == 1
    assert not await admin.exists(LEGACY)
    assert not await admin.exists(ORDERS.timer_data)  # fired; the cancelled timer's leftover dropped
    await world.step("redsaga.orders")
    assert (await world.state()).steps["reserve_stock"].attempts[-1].error is not None  # timed out
