"""The decider's operator rules: the revision check on requests, and redrive from a step."""

from __future__ import annotations

import msgspec
import pytest

from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from saga import SagaState, SagaStatus, StepStatus
from saga.core.decider import decide, start
from saga.core.effects import Dispatch, idempotency_key
from saga.core.model import (
    CancelRequested,
    ForceCompleted,
    RedriveRequested,
    RetryRequested,
    Started,
    StepReplied,
    TimerFired,
)
from saga.core.redrive import redrive_refusal
from saga.store.codec import encode_state
from saga.store.commit import command_envelope
from saga.store.keys import Partition
from tests.saga.purity import check_purity


@pytest.fixture(autouse=True)
def _decisions_leave_their_input_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    check_purity(monkeypatch, __name__)


ORDER = Order(id="o1", customer="c1", lines=[Line(sku="s", quantity=1)], total_cents=100)
OUTPUTS = {
    "reserve_stock": b'{"type":"StockReserved","reservation_id":"r1"}',
    "charge_payment": b'{"type":"CardCharged","charge_id":"c1","amount_cents":100}',
    "arrange_shipping": b'{"type":"ShipmentArranged","tracking":"t1"}',
}


def began() -> SagaState:
    data = msgspec.json.encode(ORDER)
    decision = start(order_fulfilment, "s1", data, 0, Started(id="e0", at_ms=1, data=msgspec.Raw(data)))
    decision.state.revision = 1
    return decision.state


def apply(state: SagaState, event: object) -> SagaState:
    decision = decide(order_fulfilment, state, event)  # type: ignore[arg-type]
    assert not decision.ignored, decision.ignored
    decision.state.revision = state.revision + 1
    return decision.state


def reply(state: SagaState, step: str, *, ok: bool = True, permanent: bool = False, at: int = 2) -> SagaState:
    attempt = state.steps[step].current("do")
    assert attempt is not None
    return apply(
        state,
        StepReplied(
            id=f"r-{step}-{attempt.n}",
            at_ms=at,
            step=step,
            kind="do",
            attempt=attempt.n,
            command_id=attempt.command_id,
            ok=ok,
            output=msgspec.Raw(OUTPUTS[step]) if ok else msgspec.Raw(b"null"),
            error=None if ok else "down",
            permanent=permanent,
        ),
    )


def retry_timer(state: SagaState, step: str, at: int) -> SagaState:
    step_state = state.steps[step]
    attempt = step_state.current("do")
    assert attempt is not None
    assert step_state.timer is not None
    return apply(
        state,
        TimerFired(
            id=f"t-{step}-{attempt.n}",
            at_ms=at,
            timer_id=step_state.timer,
            purpose="retry",
            step=step,
            kind="do",
            attempt=attempt.n,
        ),
    )


def dead_lettered_at_shipping() -> SagaState:
    """Reserve and charge succeed; shipping fails transiently until its 5 attempts run out."""
    state = reply(reply(began(), "reserve_stock"), "charge_payment")
    for n in range(5):
        state = reply(state, "arrange_shipping", ok=False, at=10 + n)
        if n < 4:
            state = retry_timer(state, "arrange_shipping", at=10 + n)
    assert state.status == SagaStatus.DEAD_LETTERED
    return state


def test_a_request_judged_on_an_older_revision_is_ignored_and_says_so() -> None:
    state = began()
    state = reply(state, "reserve_stock")  # the saga moved on to revision 2
    for event in (
        CancelRequested(id="x", at_ms=5, by="op", expected_revision=1),
        RetryRequested(id="x", at_ms=5, by="op", expected_revision=1),
        ForceCompleted(
            id="x",
            at_ms=5,
            step="reserve_stock",
            output=msgspec.Raw(b"{}"),
            by="op",
            reason="r",
            expected_revision=1,
        ),
        RedriveRequested(id="x", at_ms=5, step="reserve_stock", by="op", reason="r", expected_revision=1),
    ):
        decision = decide(order_fulfilment, state, event)
        assert decision.ignored.startswith("the saga moved on: the request was made at revision 1")
        assert "at revision 2 (running)" in decision.ignored
        assert decision.effects == []
        assert encode_state(decision.state) == encode_state(state)


def test_a_request_judged_on_the_current_revision_applies() -> None:
    state = reply(began(), "reserve_stock")
    decision = decide(order_fulfilment, state, CancelRequested(id="x", at_ms=5, by="op", expected_revision=2))
    assert not decision.ignored
    assert decision.state.cancel is not None


def test_redrive_of_a_dead_lettered_step_keeps_earlier_outputs_and_starts_a_new_key_generation() -> None:
    state = dead_lettered_at_shipping()
    decision = decide(
        order_fulfilment,
        state,
        RedriveRequested(id="d1", at_ms=50, step="arrange_shipping", by="op", reason="fixed"),
    )
    assert not decision.ignored
    after = decision.state
    assert after.status == SagaStatus.RUNNING
    assert after.completed == ["reserve_stock", "charge_payment"]
    assert bytes(after.steps["charge_payment"].output) == OUTPUTS["charge_payment"]
    shipping = after.steps["arrange_shipping"]
    assert shipping.status == StepStatus.DISPATCHED
    assert shipping.generation == 1  # every earlier attempt failed by reply: no effect to protect
    assert [a.n for a in shipping.attempts] == [1, 2, 3, 4, 5, 6]
    [dispatch] = [e for e in decision.effects if isinstance(e, Dispatch)]
    assert (dispatch.step, dispatch.attempt) == ("arrange_shipping", 6)
    envelope = command_envelope(after, dispatch, Partition("orders", 0), cause="d1", now_ms=50)
    assert envelope.idempotency_key == "s1:arrange_shipping:do:g1"
    assert after.error is not None
    assert (after.error.by, after.error.reason) == ("op", "fixed")


def test_redrive_from_an_earlier_step_re_runs_it_under_the_same_key() -> None:
    """A step that succeeded keeps its key: its participant answers with what it already did."""
    state = dead_lettered_at_shipping()
    decision = decide(
        order_fulfilment,
        state,
        RedriveRequested(id="d1", at_ms=50, step="charge_payment", by="op", reason="r"),
    )
    after = decision.state
    assert after.completed == ["reserve_stock"]
    assert after.steps["charge_payment"].generation == 0
    assert after.steps["charge_payment"].status == StepStatus.DISPATCHED
    assert after.steps["arrange_shipping"].status == StepStatus.PENDING
    assert after.steps["arrange_shipping"].generation == 1
    [dispatch] = [e for e in decision.effects if isinstance(e, Dispatch)]
    assert dispatch.step == "charge_payment"
    assert idempotency_key("s1", "charge_payment", "do", 0) == "s1:charge_payment:do"


def test_redrive_of_an_attempt_in_flight_keeps_its_key_and_cancels_its_timeout() -> None:
    state = began()  # reserve_stock dispatched, its 30 s timeout running
    timer = state.steps["reserve_stock"].timer
    decision = decide(
        order_fulfilment,
        state,
        RedriveRequested(id="d1", at_ms=9, step="reserve_stock", by="op", reason="lost"),
    )
    step = decision.state.steps["reserve_stock"]
    assert step.generation == 0  # the first attempt may still take effect
    assert [a.outcome for a in step.attempts] == ["cancelled", None]
    assert any(getattr(e, "timer_id", None) == timer for e in decision.effects)
    late = StepReplied(
        id="late",
        at_ms=10,
        step="reserve_stock",
        kind="do",
        attempt=1,
        command_id=step.attempts[0].command_id,
        ok=True,
        output=msgspec.Raw(OUTPUTS["reserve_stock"]),
    )
    assert decide(order_fulfilment, decision.state, late).ignored  # the old attempt's reply moves nothing


@pytest.mark.parametrize(
    ("prepare", "step", "reason"),
    [
        (began, "nope", "no step 'nope'"),
        (began, "charge_payment", "has not been reached yet (the saga is at reserve_stock)"),
        (
            lambda: reply(reply(reply(began(), "reserve_stock"), "charge_payment"), "arrange_shipping"),
            "arrange_shipping",
            "this one is completed; an ended saga is not reopened",
        ),
        (
            lambda: apply(began(), CancelRequested(id="c", at_ms=3, by="op")),
            "reserve_stock",
            "cancel was requested",
        ),
        (
            lambda: reply(reply(began(), "reserve_stock"), "charge_payment", ok=False, permanent=True),
            "reserve_stock",
            "this one is compensating",
        ),
    ],
    ids=["unknown-step", "not-reached", "ended", "cancelling", "compensating"],
)
def test_redrive_is_refused_where_it_could_repeat_or_undo_an_effect(prepare, step: str, reason: str) -> None:
    state = prepare()
    assert reason in redrive_refusal(order_fulfilment, state, step)
    decision = decide(
        order_fulfilment, state, RedriveRequested(id="d", at_ms=99, step=step, by="op", reason="r")
    )
    assert reason in decision.ignored
    assert decision.effects == []


def test_force_complete_of_a_step_never_reached_while_compensating_is_ignored() -> None:
    """Found by the replay property test: cancel, reserve succeeds, its undo is retrying; the
    cursor points at charge_payment, which never ran. Forcing it used to raise
    IllegalTransition (pending -> succeeded) inside the decider."""
    state = apply(began(), CancelRequested(id="c", at_ms=2, by="op"))
    state = reply(state, "reserve_stock")
    assert state.status == SagaStatus.COMPENSATING
    decision = decide(
        order_fulfilment,
        state,
        ForceCompleted(
            id="f", at_ms=3, step="charge_payment", output=msgspec.Raw(b"{}"), by="op", reason="r"
        ),
    )
    assert decision.ignored == "the saga is compensating; only a failed compensation can be force-completed"
    assert decision.effects == []
