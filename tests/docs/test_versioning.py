"""docs/versioning.md: its rules table is the code's, and its worked example runs as shown."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

import bus
from redsaga.cli.main import app as cli
from redsaga.examples import orders, orders_v2
from redsaga.examples.contracts import Line, Order
from saga import SagaClient, SagaWorker, Versions, run_migration
from saga.errors import IncompatibleChange
from saga.versions.rules import rules_table
from tests.docs import versioning_example

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "versioning.md").read_text()


def test_the_rules_table_is_generated_from_the_code() -> None:
    assert rules_table() in DOC


def test_the_migration_shown_is_the_one_in_the_example_service() -> None:
    [block] = re.findall(r"```python\n(@migration.*?)```", DOC, flags=re.DOTALL)
    assert block in (ROOT / "services_example" / "orders_v2.py").read_text()


@pytest.fixture
async def production(fake_redis: bus.Redis) -> bus.Redis:
    """Version 1 registered by a worker, with three orders in flight (no participant answers)."""
    await SagaWorker(fake_redis, orders.app, consumer="orders-1").register()
    client = SagaClient(fake_redis, orders.app.registry)
    for n in range(3):
        order = Order(id=f"o{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=1000)
        await client.start("order_fulfilment", order, saga_id=f"order-o{n}")
    return fake_redis


@pytest.mark.anyio
async def test_the_worked_example_runs_as_the_doc_shows(production: bus.Redis, tmp_path: Path) -> None:
    redis = production
    snapshot = tmp_path / "versions.json"
    snapshot.write_bytes(msgspec.json.encode(await Versions(redis).snapshot(), order="sorted"))

    runner = CliRunner()
    edited = runner.invoke(
        cli, ["versions", "check", "--app", "tests.docs.versioning_example:app", "--snapshot", str(snapshot)]
    )
    assert edited.exit_code == 1
    assert edited.stdout.splitlines() == [
        "order_fulfilment@1: step 'check_fraud' was inserted before existing steps: make this version 2"
    ]
    assert edited.stdout.strip() in DOC
    v2 = runner.invoke(
        cli, ["versions", "check", "--app", "redsaga.examples.orders_v2:app", "--snapshot", str(snapshot)]
    )
    assert v2.exit_code == 0, v2.output
    assert v2.stdout == ""

    with pytest.raises(IncompatibleChange) as refused:
        await SagaWorker(redis, versioning_example.app).register()
    assert f"error: {refused.value}" in DOC

    await SagaWorker(redis, orders_v2.app, consumer="orders-2").register()
    client = SagaClient(redis, orders_v2.app.registry)
    assert (await client.get(await client.start("order_fulfilment", _order()))).version == 2

    versions = Versions(redis)
    await versions.drain("order_fulfilment", 1, reason="v2 adds the fraud check")
    dry = await run_migration(redis, orders_v2.fraud_check_for_running_orders, dry_run=True)
    assert sorted((r.saga_id, r.outcome, r.step, r.to_step) for r in dry.results) == [
        (f"order-o{n}", "would_migrate", "reserve_stock", "reserve_stock") for n in range(3)
    ]
    done = await run_migration(redis, orders_v2.fraud_check_for_running_orders)
    assert done.count("migrated") == 3
    rows = {row.key: row for row in await versions.status()}
    assert (rows["order_fulfilment@1"].in_flight, rows["order_fulfilment@2"].in_flight) == (0, 4)
    await versions.decommission("order_fulfilment", 1)
    fulfilment = [key for key in await versions.shapes("orders") if key.startswith("order_fulfilment@")]
    assert fulfilment == ["order_fulfilment@2"]  # beside it: large_order@1, the orders app's other saga


def _order() -> Order:
    return Order(id="o9", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=1000)
