"""docs/flow-control.md: the rate-limit examples run as written, and the page keeps its promises."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import inventory, payments, shipping
from saga import App
from saga.testing import SagaRunner

DOC = (Path(__file__).parents[2] / "docs" / "flow-control.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, re.DOTALL)


def namespace() -> dict[str, Any]:
    orders = [
        Order(id=f"o{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=1) for n in range(5)
    ]
    return {
        "order_fulfilment": order_fulfilment,
        "inventory": inventory,
        "payments": payments,
        "shipping": shipping,
        "orders": orders,
    }


def test_the_declaration_makes_an_app_with_both_limits() -> None:
    found = namespace()
    exec(compile(blocks("python")[0], "docs/flow-control.md", "exec"), found)  # noqa: S102
    app = found["app"]
    assert isinstance(app, App)
    assert sorted(app.limits.by_name) == ["order_fulfilment.reserve_stock", "payments"]


def test_the_runner_example_runs_as_written() -> None:
    found = namespace()
    exec(compile(blocks("python")[1], "docs/flow-control.md", "exec"), found)  # noqa: S102
    runner = found["runner"]
    assert isinstance(runner, SagaRunner)
    assert {runner.status(saga_id) for saga_id in found["ids"]} == {"completed"}
