"""The example's large orders: a manager approves, the order is fulfilled as a child saga; an
overdue approval goes to the senior managers; a refusal ends the order with nothing done."""

from __future__ import annotations

import msgspec
import pytest

from redsaga.examples import stateless
from redsaga.examples.contracts import Line, Order
from redsaga.examples.desk import DemoClock, authorize
from redsaga.examples.orders import (
    APPROVAL_DUE,
    APPROVAL_LIMIT_CENTS,
    Approval,
    large_order,
    order_fulfilment,
    saga_for,
)
from saga.core.states import SagaStatus
from saga.errors import NotAuthorized
from saga.testing import SagaRunner

HOURS = APPROVAL_DUE.total_seconds() / 3600


def order(total: int = APPROVAL_LIMIT_CENTS + 1, **failures: str) -> Order:
    return Order(id="big", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=total, **failures)  # type: ignore[arg-type]


def runner() -> SagaRunner:
    return SagaRunner(
        large_order,
        order_fulfilment,
        participants=[stateless.inventory, stateless.payments, stateless.shipping],
        authorize=authorize,
    )


def charges(run: SagaRunner) -> list[str]:
    """The orders whose card the sagas charged (payments' ChargeCard commands)."""
    sent = [msgspec.json.decode(d.payload) for _, d in run.dispatched if d.message_type == "ChargeCard"]
    return [command["order_id"] for command in sent]


def test_only_orders_above_the_limit_wait_for_a_manager() -> None:
    assert saga_for(order(APPROVAL_LIMIT_CENTS)) is order_fulfilment
    assert saga_for(order(APPROVAL_LIMIT_CENTS + 1)) is large_order


def test_an_approved_large_order_is_fulfilled_as_a_child_saga() -> None:
    run = runner()
    saga_id = run.start(order(), definition=large_order, saga_id="big")
    run.run_until_idle()
    (task,) = run.tasks(role="managers")
    assert task.title == f"Approve order big of {(APPROVAL_LIMIT_CENTS + 1) / 100:.2f} for c"
    assert charges(run) == []  # nothing happens before the approval
    with pytest.raises(NotAuthorized):
        run.tasks.complete(task.id, Approval(approved=True), by="sam")  # not a manager, and not escalated
    run.tasks.claim(task.id, by="ann")
    run.tasks.complete(task.id, Approval(approved=True), by="ann")
    run.run_until_idle()
    assert run.status(saga_id) == SagaStatus.COMPLETED
    assert run.status("big/fulfil") == SagaStatus.COMPLETED
    assert charges(run) == ["big"]


def test_an_overdue_approval_goes_to_the_senior_managers_once() -> None:
    run = runner()
    saga_id = run.start(order(), definition=large_order, saga_id="big")
    run.run_until_idle()
    run.advance(hours=HOURS + 0.1)
    assert run.tasks(role="managers") == []
    (task,) = run.tasks(role="senior-managers")
    run.advance(hours=HOURS / 2)  # within the extension: nothing more happens
    run.tasks.claim(task.id, by="sam")
    run.tasks.complete(task.id, Approval(approved=True, note="late"), by="sam")
    run.run_until_idle()
    assert run.status(saga_id) == SagaStatus.COMPLETED
    actions = [e.action for e in run.tasks.log(saga_id)]
    assert actions == [
        "opened",
        "escalation: reassigned",
        "escalation: extended",
        "claimed",
        "completed",
    ]


def test_a_refused_or_forgotten_large_order_charges_nothing() -> None:
    run = runner()
    refused = run.start(order(), definition=large_order, saga_id="big")
    run.run_until_idle()
    (task,) = run.tasks(role="managers")
    run.tasks.complete(task.id, Approval(approved=False, note="too much"), by="ann")
    run.run_until_idle()
    assert run.status(refused) == SagaStatus.COMPENSATED
    assert "not approved: too much" in str(run.state(refused).steps["approved"].attempts[-1].error)
    forgotten = run.start(order(), definition=large_order, saga_id="forgotten")
    run.run_until_idle()
    run.advance(hours=2 * HOURS + 0.1)  # past the due time and its one extension
    assert run.status(forgotten) == SagaStatus.COMPENSATED
    assert charges(run) == []
    run.assert_invariants()


def test_the_demo_clock_skips_ahead_and_knows_the_real_time_a_saga_took() -> None:
    clock = DemoClock()
    start = clock.now_ms()
    clock.skip(3_600_000)
    assert clock.script_now_ms() >= start + 3_600_000
    end = clock.now_ms()
    assert 0 <= clock.real_ms(start, end) < 60_000
    assert clock.real_ms(end, end + 5) == 5  # after the skip: nothing to leave out
