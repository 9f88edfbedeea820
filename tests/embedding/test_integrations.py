"""saga.integrations: the worker in a lifespan, and redsaga's errors as HTTP statuses."""

from __future__ import annotations

from typing import Any

import pytest

import bus
import saga.errors
from saga import App, Saga, SagaClient, SagaStatus, SagaWorker, command
from saga.errors import (
    IncompatibleChange,
    InvalidInput,
    ResultTimeout,
    SagaCompensated,
    SagaError,
    SagaNotFound,
    StartConflict,
    TaskNotFound,
)
from saga.integrations.http import STATUSES, body_of, status_of
from saga.integrations.starlette import run_worker
from tests.embedding.shop import Charge, Charged, Order, Shipped, checkout, embedded, payments

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (SagaNotFound("o1"), 404),
        (TaskNotFound("t1"), 404),
        (StartConflict("o1", "checkout@1"), 409),
        (InvalidInput("bad"), 422),
        (ResultTimeout("o1", "running", 1.0), 504),
        (bus.PayloadTooLarge(10, 5), 413),
        (bus.RedisUnavailable("down"), 503),
        (SagaError("unexpected"), 500),
        (ValueError("not ours"), 500),
    ],
)
def test_each_error_answers_with_its_status(error: Exception, status: int) -> None:
    assert status_of(error) == status


def test_every_saga_error_has_a_status_of_its_class_or_a_base() -> None:
    classes = [getattr(saga.errors, name) for name in saga.errors.__all__]
    assert all(any(base in STATUSES for base in cls.__mro__) for cls in classes)


async def test_an_unsuccessful_end_answers_409_with_what_ended_it(fake_redis: bus.Redis) -> None:
    worker, client = embedded(fake_redis)
    await client.start(checkout, Order(id="nowhere-1", amount=5), saga_id="nowhere-1")
    await worker.run_until_idle()
    with pytest.raises(SagaCompensated) as raised:
        await client.result("nowhere-1")
    assert status_of(raised.value) == 409
    assert body_of(raised.value) == {
        "error": "SagaCompensated",
        "detail": str(raised.value),
        "saga_id": "nowhere-1",
        "status": "compensated",
        "definition": "checkout@1",
        "step": "ship",
        "reason": raised.value.reason,
    }


async def test_run_worker_runs_the_worker_for_the_block_and_stops_it_after(fake_redis: bus.Redis) -> None:
    worker, client = embedded(fake_redis)
    async with run_worker(worker) as running:
        assert running is worker
        assert worker.started.is_set()
        await client.start(checkout, Order(id="o-1", amount=5), saga_id="o-1")
        assert await client.result("o-1", timeout=30) == Shipped(tracking="T-o-1")
    await client.start(checkout, Order(id="o-2", amount=5), saga_id="o-2")
    with pytest.raises(ResultTimeout):  # the worker stopped with the block
        await client.result("o-2", timeout=0.2)
    assert (await client.get("o-2")).status == SagaStatus.RUNNING


async def test_a_worker_that_fails_ends_the_block_with_its_error(fake_redis: bus.Redis) -> None:
    """Here its definition's shape changed incompatibly under a saga in flight: it refuses to start."""
    changed = Saga("checkout", version=1, context="shop", data=Order)

    @changed.step(reply=Charged)
    def pay(order: Order) -> Any:
        return command("payments", Charge(order_id=order.id, amount=order.amount))

    before = App("shop", sagas=[changed], participants=[payments])
    await SagaWorker(fake_redis, before).register()
    await SagaClient(fake_redis, before.registry).start(changed, Order(id="o-1", amount=1))  # in flight
    worker, _ = embedded(fake_redis)
    entered = False
    with pytest.raises(IncompatibleChange):  # noqa: PT012 - the block must not be entered
        async with run_worker(worker):
            entered = True
            worker.stop()
    assert not entered
