"""``SagaClient.wait`` and ``result``: the output, a typed error per end, no polling."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import bus
from saga import SagaNotFound, SagaStatus
from saga.errors import (
    ResultTimeout,
    SagaCancelled,
    SagaCompensated,
    SagaDeadLettered,
    SagaEnded,
    SagaFailed,
)
from saga.runtime import results
from saga.store.keys import Partition
from tests.embedding.shop import Order, Shipped, checkout, embedded

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
PARTITION = Partition("shop", 0)


async def test_result_is_the_last_steps_output_decoded(redis: bus.Redis) -> None:
    worker, client = embedded(redis)
    await client.start(checkout, Order(id="o-1", amount=5), saga_id="o-1")
    await worker.run_until_idle()
    assert await client.result("o-1") == Shipped(tracking="T-o-1")
    assert (await client.wait("o-1")).status == SagaStatus.COMPLETED


@pytest.mark.parametrize(
    ("order_id", "error", "step", "reason"),
    [
        ("declined-1", SagaFailed, "charge", "card declined"),
        ("nowhere-1", SagaCompensated, "ship", "no carrier for this address"),
        ("flaky-1", SagaDeadLettered, "ship", "carrier down"),
    ],
)
async def test_each_end_but_completed_raises_its_error_with_fields(
    redis: bus.Redis, order_id: str, error: type[SagaEnded], step: str, reason: str
) -> None:
    worker, client = embedded(redis)
    await client.start(checkout, Order(id=order_id, amount=5), saga_id=order_id)
    await worker.run_until_idle()
    with pytest.raises(error) as raised:
        await client.result(order_id)
    ended = raised.value
    assert (ended.saga_id, ended.definition, ended.step) == (order_id, "checkout@1", step)
    assert reason in ended.reason
    assert ended.state.status == error.status == (await client.get(order_id)).status
    assert isinstance(ended, SagaEnded)


async def test_a_cancelled_saga_raises_saga_cancelled(redis: bus.Redis) -> None:
    worker, client = embedded(redis)
    await client.start(checkout, Order(id="o-2", amount=5), saga_id="o-2")
    await client.cancel("o-2", reason="changed my mind")
    await worker.run_until_idle()
    with pytest.raises(SagaCancelled) as raised:
        await client.result("o-2")
    assert raised.value.reason == "changed my mind"
    assert "ended cancelled" in str(raised.value)


async def test_a_waiter_wakes_when_a_worker_ends_the_saga(redis: bus.Redis) -> None:
    worker, client = embedded(redis)
    got: list[Any] = []

    async def wait_for_it() -> None:
        got.append(await client.result("o-3"))  # no timeout: as long as it takes
        worker.stop()

    await client.start(checkout, Order(id="o-3", amount=5), saga_id="o-3")
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(wait_for_it)
        tasks.start_soon(worker.run)
    assert got == [Shipped(tracking="T-o-3")]


async def test_a_saga_that_does_not_end_in_time_raises_result_timeout(redis: bus.Redis) -> None:
    _, client = embedded(redis)
    await client.start(checkout, Order(id="o-4", amount=5), saga_id="o-4")
    with pytest.raises(ResultTimeout) as raised:
        await client.result("o-4", timeout=0.05)  # no worker runs: it cannot end
    assert (raised.value.saga_id, raised.value.status) == ("o-4", "running")
    assert isinstance(raised.value, TimeoutError)
    with pytest.raises(ResultTimeout):
        await client.wait("o-4", timeout=0)


async def test_waiting_for_no_saga_raises_saga_not_found(redis: bus.Redis) -> None:
    _, client = embedded(redis)
    with pytest.raises(SagaNotFound):
        await client.result("nobody", timeout=1)


class Counting:
    """``redis`` with its saga reads and its reads of the ends counted, and a hook run before
    each of its first blocking reads."""

    def __init__(self, redis: bus.Redis, *hooks: Any) -> None:
        self.redis, self.hooks, self.saga_reads, self.stream_reads = redis, list(hooks), 0, 0

    async def hgetall(self, key: str) -> Any:
        self.saga_reads += 1
        return await self.redis.hgetall(key)

    async def xread(self, *args: Any, **kwargs: Any) -> Any:
        self.stream_reads += 1
        if self.hooks:
            await self.hooks.pop(0)()
        return await self.redis.xread(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.redis, name)


async def test_a_waiter_reads_its_saga_again_only_when_the_stream_names_it(redis: bus.Redis) -> None:
    """Other sagas' ends wake the waiter but cost no read of its saga."""
    worker, client = embedded(redis)
    await client.start(checkout, Order(id="o-5", amount=5), saga_id="o-5")

    async def others_end() -> None:
        for other in ("x", "y"):
            await redis.xadd(PARTITION.ends, {"saga": other, "status": "completed"})

    async def it_ends() -> None:
        await client.cancel("o-5")
        await worker.run_until_idle()

    counting = Counting(redis, others_end, it_ends)
    state = await results.wait_settled(counting, PARTITION, "o-5", timeout_s=60, block_ms=200)
    assert state.status == SagaStatus.CANCELLED
    assert counting.stream_reads == 2
    assert counting.saga_reads == 2  # before waiting, and when its own end came


async def test_a_full_read_of_other_ends_reads_the_saga_again(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter that falls behind may have had its own entry trimmed away: it looks."""
    monkeypatch.setattr(results, "READ_COUNT", 2)
    worker, client = embedded(redis)
    await client.start(checkout, Order(id="o-8", amount=5), saga_id="o-8")

    async def ends_unannounced() -> None:
        await worker.run_until_idle()
        await redis.delete(PARTITION.ends)  # as if trimmed
        for other in ("x", "y"):
            await redis.xadd(PARTITION.ends, {"saga": other, "status": "completed"})

    state = await results.wait_settled(
        Counting(redis, ends_unannounced), PARTITION, "o-8", timeout_s=60, block_ms=200
    )
    assert state.status == SagaStatus.COMPLETED
