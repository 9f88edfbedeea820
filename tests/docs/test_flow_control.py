"""docs/flow-control.md: the examples run as written, and the page keeps its promises."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import inventory, payments, shipping
from saga import App
from saga.metrics._slots import SLOT_METRICS
from saga.testing import SagaRunner
from tests.flow.key_sagas import LOG, Debit, Debited, Notified, Notify, Withdrawal, ledger

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


def key_namespace() -> dict[str, Any]:
    LOG.clear()
    messages = {"Debit": Debit, "Debited": Debited, "Notify": Notify, "Notified": Notified}
    return {"Withdrawal": Withdrawal, "ledger": ledger, **messages}


def test_the_key_examples_declare_what_they_say() -> None:
    found = key_namespace()
    exec(compile(blocks("python")[2], "docs/flow-control.md", "exec"), found)  # noqa: S102
    key = found["withdraw"].concurrency
    assert (key.name, key.limit, key.claim(Withdrawal("acct-42")).value) == ("withdraw", 1, "acct-42")
    exec(compile(blocks("python")[3], "docs/flow-control.md", "exec"), found)  # noqa: S102
    claim = found["imports"].concurrency.claim(Withdrawal("x", priority=5, tenant="checkout"))
    assert (claim.value, claim.priority, claim.tenant, claim.weight) == ("all", 5, "checkout", 3)


def test_the_key_runner_example_runs_as_written() -> None:
    found = key_namespace()
    exec(compile(blocks("python")[2], "docs/flow-control.md", "exec"), found)  # noqa: S102
    exec(compile(blocks("python")[4], "docs/flow-control.md", "exec"), found)  # noqa: S102
    assert LOG[:2] == [(found["first"], "debit"), (found["first"], "notify")]  # the first, then the second


def test_the_page_names_every_concurrency_metric() -> None:
    for spec in SLOT_METRICS:
        assert spec.name in DOC, spec.name
