"""A worker that may only read rs:epoch (a participant's ACL user) waits for it, and never
writes it: not when it joins, not when it finds it gone."""

from __future__ import annotations

import pytest

import bus
from bus._epoch import EPOCH_KEY, check_epoch, join_epoch

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]


async def test_a_reader_waits_for_the_first_writer_and_then_joins_its_epoch(redis: bus.Redis) -> None:
    await redis.delete(EPOCH_KEY)
    with pytest.raises(bus.EpochNotSet) as refused:
        await join_epoch(redis, create=False)
    assert refused.value.retryable
    assert await redis.get(EPOCH_KEY) is None  # nothing written
    epoch = await join_epoch(redis)  # an orchestrator's worker
    assert await join_epoch(redis, create=False) == epoch


async def test_a_reader_stops_on_a_lost_epoch_without_marking_it(redis: bus.Redis) -> None:
    epoch = await join_epoch(redis)
    await redis.delete(EPOCH_KEY)
    with pytest.raises(bus.RedisDataLost):
        await check_epoch(redis, epoch, mark=False)
    assert await redis.get(EPOCH_KEY) is None  # the writer's check leaves the marker, not this one
    await redis.set(EPOCH_KEY, f"lost:{epoch}")
    with pytest.raises(bus.RedisDataLost):
        await join_epoch(redis, create=False)
    await check_epoch(redis, f"lost:{epoch}", mark=False)  # unchanged: nothing to say
