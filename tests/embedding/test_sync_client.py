"""``SyncSagaClient``: one client shared by many threads, its loop and pool living with it."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from typing import Any

import fakeredis
import fakeredis.aioredis
import pytest
import redis as sync_redis

import bus
from saga import StartConflict
from saga.errors import SagaCompensated
from tests.conftest import REDIS_URL, require_server
from tests.embedding.shop import Order, Shipped, checkout, synced, worker_thread

Connect = Callable[[], Any]


@pytest.fixture(params=["fake", "real"])
def connect(request: pytest.FixtureRequest) -> Iterator[Connect]:
    """How each thread's loop builds its Redis client: one fakeredis server, or the test Redis."""
    if request.param == "fake":
        server = fakeredis.FakeServer(version=(7, 0))
        yield lambda: fakeredis.aioredis.FakeRedis(server=server, protocol=2)
        return
    require_server("Redis", REDIS_URL)
    with sync_redis.Redis.from_url(REDIS_URL) as admin:
        admin.flushdb()
    yield lambda: bus.connect(REDIS_URL)


def test_many_threads_start_and_wait_through_one_client(connect: Connect) -> None:
    orders = [f"o-{i}" for i in range(12)] + ["nowhere-1"]
    with worker_thread(connect), synced(connect) as client:

        def order(order_id: str) -> Any:
            client.start(checkout, Order(id=order_id, amount=1), saga_id=order_id)
            try:
                return client.result(order_id, timeout=60)
            except SagaCompensated as ended:
                return ended.status

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            outcomes = dict(zip(orders, pool.map(order, orders), strict=True))
        assert outcomes == {
            **{o: Shipped(tracking=f"T-{o}") for o in orders[:-1]},
            "nowhere-1": "compensated",
        }
        assert client.get("o-1").status == "completed"
        assert sorted(client.list("completed")) == sorted(orders[:-1])


def test_errors_are_raised_in_the_calling_thread(connect: Connect) -> None:
    with synced(connect) as client:
        client.start(checkout, Order(id="o-1", amount=1), saga_id="o-1")
        caught: list[BaseException] = []

        def conflicting() -> None:
            try:
                client.start(checkout, Order(id="o-1", amount=2), saga_id="o-1")
            except StartConflict as error:
                caught.append(error)

        thread = threading.Thread(target=conflicting)
        thread.start()
        thread.join()
        assert [type(e) for e in caught] == [StartConflict]


def test_a_closed_client_refuses_calls_and_ends_the_waits_in_flight(connect: Connect) -> None:
    client = synced(connect)
    client.start(checkout, Order(id="o-1", amount=1), saga_id="o-1")
    waiting = concurrent.futures.ThreadPoolExecutor(1).submit(client.wait, "o-1")  # no worker: never ends
    client.close()
    with pytest.raises(concurrent.futures.CancelledError):
        waiting.result(timeout=30)
    with pytest.raises(RuntimeError, match="closed"):
        client.get("o-1")
    client.close()  # a second close does nothing
    assert not client._thread.is_alive()
