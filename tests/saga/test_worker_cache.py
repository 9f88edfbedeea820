"""A worker's cache, shared with the clients it makes: no read for a saga this process wrote."""

from __future__ import annotations

from typing import Any

import pytest

import bus
import saga.runtime.orchestrator as orchestrator_module
from bus import FakeClock
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import app
from saga import App, EngineConfig, SagaClient, SagaStatus, SagaWorker
from saga.core.model import CancelRequested
from saga.ops.reader import SagaReader
from tests.saga import compose_sagas
from tests.saga.compose_sagas import Plan, Services

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
ORDER = Order(id="o1", customer="c1", lines=[Line(sku="s", quantity=1)], total_cents=100)
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The saga ids the orchestrators read from Redis (their cache did not have them)."""
    seen: list[str] = []
    load = orchestrator_module.load_saga

    async def counting(redis: Any, partition: Any, saga_id: str, *args: Any) -> Any:
        seen.append(saga_id)
        return await load(redis, partition, saga_id, *args)

    monkeypatch.setattr(orchestrator_module, "load_saga", counting)
    return seen


async def test_a_saga_started_by_the_workers_client_is_never_read_back(
    redis: bus.Redis, reads: list[str]
) -> None:
    worker = SagaWorker(redis, app, config=CONFIG, clock=FakeClock())
    client = worker.client()
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    await worker.run_until_idle()
    assert (await client.get("s1")).status == SagaStatus.COMPLETED
    assert reads == []


async def test_a_client_of_its_own_costs_one_read(redis: bus.Redis, reads: list[str]) -> None:
    clock = FakeClock()
    worker = SagaWorker(redis, app, config=CONFIG, clock=clock)
    client = SagaClient(redis, app.registry, clock=clock)
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    await worker.run_until_idle()
    assert (await client.get("s1")).status == SagaStatus.COMPLETED
    assert reads == ["s1"]


async def test_a_start_kept_by_a_worker_that_did_not_run_it_costs_a_lost_race_not_a_wrong_state(
    redis: bus.Redis, reads: list[str]
) -> None:
    """Another worker ran the saga to its end: the first one's kept start is stale."""
    clock = FakeClock()
    first = SagaWorker(redis, app, config=CONFIG, clock=clock, consumer="first")
    second = SagaWorker(redis, app, config=CONFIG, clock=clock, consumer="second")
    await first.client().start(order_fulfilment, ORDER, saga_id="s1")
    await second.run_until_idle()
    client = SagaClient(redis, app.registry, clock=clock)
    assert (await client.get("s1")).status == SagaStatus.COMPLETED
    revision = (await client.get("s1")).revision
    assert first.cache.get("orders", "s1") is not None  # still the start, at revision 1

    await client.cancel("s1")
    await first.run_until_idle()  # its stale copy is refused on commit: read, decided again

    ended = await client.get("s1")
    assert ended.status == SagaStatus.COMPLETED
    assert ended.revision == revision  # on the stale copy it would have cancelled a running saga
    [*_, last] = await SagaReader(redis, app.registry).history("s1")
    assert isinstance(last.event, CancelRequested)
    assert "already ended" in last.ignored
    assert reads == ["s1", "s1"]  # second's first reply (not in its cache), then first's second try


async def test_a_child_saga_started_by_a_step_is_never_read_back(redis: bus.Redis, reads: list[str]) -> None:
    async def no_cancel(_saga_id: str) -> None:
        raise AssertionError("nothing here cancels")

    services = Services(no_cancel)
    both = App("both", sagas=[compose_sagas.parent, compose_sagas.invoicing], participants=[services.build()])
    worker = SagaWorker(redis, both, config=CONFIG, clock=FakeClock())
    await worker.client().start(compose_sagas.parent, Plan(id="p1"), saga_id="p1")
    await worker.run_until_idle()
    client = worker.client()
    assert (await client.get("p1", context="compose")).status == SagaStatus.COMPLETED
    assert (await client.get("p1/bill", context="billing")).status == SagaStatus.COMPLETED
    assert reads == []
