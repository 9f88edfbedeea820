"""Sleeps, signals, event waits and deadlines on the in-process runner (the real decider)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from saga import DefinitionError, EngineConfig, InvalidInput, InvalidToken, Saga, SagaStatus, StepStatus
from saga.core.decider import decide
from saga.core.model import SignalReceived
from saga.testing import SagaRunner, no_reply
from tests.saga.purity import check_purity
from tests.saga.time_sagas import (
    NOON,
    TREASURY_EVENTS,
    Approval,
    AskApproval,
    Disburse,
    FundsReady,
    Loan,
    Release,
    Reserve,
    Trip,
    approval,
    fakes,
    loan,
    trip,
)


@pytest.fixture(autouse=True)
def _decisions_leave_their_input_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    check_purity(monkeypatch, __name__)


LOAN = Loan(id="L1", amount=500)
YES = Approval(approved=True, by="ann")


def runner(*, reorder: object = None) -> SagaRunner:
    return SagaRunner(loan, trip, participants=fakes(), start_time=NOON)


def waiting_for_approval() -> tuple[SagaRunner, str]:
    r = runner()
    saga_id = r.start(LOAN, definition=loan)
    r.run_until_idle()
    return r, saga_id


def test_a_signal_wait_suspends_the_saga_and_its_token_resumes_it() -> None:
    r, saga_id = waiting_for_approval()
    assert r.status(saga_id) == SagaStatus.SUSPENDED
    [sent] = r.participant("mailer").received(AskApproval)
    query = r.query(saga_id)
    assert query.wait is not None
    assert (query.wait.kind, query.wait.step, query.wait.n) == ("signal", "approval", 1)
    assert query.wait.token == sent.token == r.resume_token(saga_id, approval)
    assert query.wait.until_ms == r.now_ms + int(timedelta(days=2).total_seconds() * 1000)
    assert query.step == "approval"

    r.signal(sent.token, YES)
    r.run_until_idle()
    state = r.state(saga_id)
    assert state.steps["approval"].status == StepStatus.SUCCEEDED
    assert state.status == SagaStatus.SUSPENDED  # now cooling off
    assert r.query(saga_id).wait.kind == "sleep"  # type: ignore[union-attr]


def test_the_whole_loan_sleeps_waits_for_funds_and_completes() -> None:
    r, saga_id = waiting_for_approval()
    r.signal(r.resume_token(saga_id, approval), YES)
    r.run_until_idle()
    wake = r.query(saga_id).wait
    assert wake is not None
    assert wake.until_ms == r.now_ms + 3_600_000
    r.advance(minutes=59)
    assert r.state(saga_id).wait.step == "cool_off"  # type: ignore[union-attr]
    r.advance(minutes=1)
    waiting = r.query(saga_id).wait
    assert waiting is not None
    assert (waiting.kind, waiting.key, waiting.message_type) == ("event", "L1", "FundsReady")
    r.publish(TREASURY_EVENTS, FundsReady(loan_id="other", ref="x"))  # another loan's event
    r.run_until_idle()
    assert r.status(saga_id) == SagaStatus.SUSPENDED
    r.publish(TREASURY_EVENTS, FundsReady(loan_id="L1", ref="wire-7"))
    r.run_until_idle()
    assert r.status(saga_id) == SagaStatus.COMPLETED
    assert r.participant("ledger").received(Disburse) == [Disburse(loan_id="L1", ref="wire-7")]
    assert r.replay(saga_id) == r.state(saga_id)
    r.assert_invariants()


def test_a_signal_delivered_twice_resumes_once_and_the_repeat_is_recorded() -> None:
    r, saga_id = waiting_for_approval()
    token = r.resume_token(saga_id, approval)
    r.signal(token, YES)
    r.signal(token, Approval(approved=False, by="bob"))
    r.run_until_idle()
    signals = [h for h in r.history(saga_id) if isinstance(h.event, SignalReceived)]
    assert [bool(h.ignored) for h in signals] == [False, True]
    assert "late or duplicate" in signals[1].ignored
    assert bytes(r.state(saga_id).steps["approval"].output) == b'{"approved":true,"by":"ann"}'
    r.assert_invariants()


@pytest.mark.parametrize(
    "tamper",
    [
        lambda t: t[:-2] + ("AA" if t[-2:] != "AA" else "BB"),  # signature changed
        lambda t: t.replace(t.split(".")[1], t.split(".")[1][:-3] + "xyz"),  # payload changed
        lambda t: "rs1.W10.AAAA",  # made up
        lambda t: "not a token",
    ],
    ids=["signature", "payload", "made-up", "garbage"],
)
def test_a_forged_or_tampered_token_is_refused_and_nothing_changes(tamper: object) -> None:
    r, saga_id = waiting_for_approval()
    before = r.history(saga_id)
    with pytest.raises(InvalidToken, match="resume token is"):
        r.signal(tamper(r.resume_token(saga_id, approval)), YES)  # type: ignore[operator]
    r.run_until_idle()
    assert r.history(saga_id) == before


def test_a_token_for_another_saga_cannot_be_made_from_this_one() -> None:
    r, first = waiting_for_approval()
    second = r.start(Loan(id="L2", amount=1), definition=loan)
    r.run_until_idle()
    token = r.resume_token(first, approval)
    payload = token.split(".")[1]
    import base64
    import json

    raw = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    raw[2] = second
    forged_payload = base64.urlsafe_b64encode(json.dumps(raw).encode()).rstrip(b"=").decode()
    with pytest.raises(InvalidToken):
        r.signal(token.replace(payload, forged_payload), YES)
    assert r.status(second) == SagaStatus.SUSPENDED


def test_signal_data_of_the_wrong_type_is_refused() -> None:
    r, saga_id = waiting_for_approval()
    with pytest.raises(InvalidInput, match="not a valid Approval"):
        r.signal(r.resume_token(saga_id, approval), {"approved": "maybe"})


def test_a_signal_that_beats_its_wait_is_kept_and_consumed_when_the_wait_begins() -> None:
    r = runner()
    r.pause("mailer")  # the approval e-mail's reply is slow; the approver is quick
    saga_id = r.start(LOAN, definition=loan)
    r.run_until_idle()
    r.signal(r.resume_token(saga_id, approval), YES)
    r.run_until_idle()
    state = r.state(saga_id)
    assert state.steps["approval"].status == StepStatus.PENDING
    assert list(state.signals) == ["approval:1"]
    r.resume("mailer")
    r.run_until_idle()
    state = r.state(saga_id)
    assert state.steps["approval"].status == StepStatus.SUCCEEDED
    assert state.wait is not None
    assert state.wait.step == "cool_off"
    assert state.signals == {}
    r.assert_invariants()


def test_a_signal_wait_that_times_out_compensates() -> None:
    r, saga_id = waiting_for_approval()
    r.advance(days=2)
    state = r.state(saga_id)
    assert state.status == SagaStatus.COMPENSATED
    assert state.error is not None
    assert state.error.what == "wait 1 timeout"
    assert "no signal within 172800s" in state.error.reason
    assert r.participant("ledger").received(Release) == [Release(loan_id="L1")]
    r.signal(r.resume_token(saga_id, approval), YES)  # too late: recorded, ignored
    r.run_until_idle()
    assert r.history(saga_id)[-1].ignored.startswith("signal after the saga ended")
    r.assert_invariants()


def test_an_event_that_comes_before_the_wait_is_kept_for_it() -> None:
    r, saga_id = waiting_for_approval()
    r.publish(TREASURY_EVENTS, FundsReady(loan_id="L1", ref="early"))
    r.signal(r.resume_token(saga_id, approval), YES)
    r.run_until_idle()
    assert r.status(saga_id) == SagaStatus.SUSPENDED  # cooling off; the event waits in the buffer
    r.advance(hours=1)
    assert r.status(saga_id) == SagaStatus.COMPLETED
    assert (
        bytes(r.state(saga_id).steps["funds"].output) == b'{"type":"FundsReady","loan_id":"L1","ref":"early"}'
    )


def test_an_early_event_expires_after_the_buffer_time() -> None:
    r = SagaRunner(loan, participants=fakes(), start_time=NOON, config=EngineConfig(event_buffer_s=600))
    saga_id = r.start(LOAN)
    r.run_until_idle()
    r.publish(TREASURY_EVENTS, FundsReady(loan_id="L1", ref="early"))
    r.signal(r.resume_token(saga_id, approval), YES)
    r.run_until_idle()
    r.advance(days=1, hours=2)  # cool-off ends an hour in; the buffer (10 minutes) expired before
    state = r.state(saga_id)
    assert state.status == SagaStatus.COMPENSATED
    assert state.error is not None
    assert "no matching event within 86400s" in state.error.reason


@pytest.mark.parametrize("seed", range(30))
def test_event_before_or_after_the_wait_registers_in_any_order(seed: int) -> None:
    # The registration and the event race on the runner's queue in a random order.
    import random

    r = SagaRunner(loan, participants=fakes(), start_time=NOON, reorder=random.Random(seed))
    saga_id = r.start(Loan(id="L1", amount=1, sleep_until=NOON.isoformat()))
    r.run_until_idle()
    r.signal(r.resume_token(saga_id, approval), YES)
    r.publish(TREASURY_EVENTS, FundsReady(loan_id="L1", ref="r"))
    r.run_until_idle()
    assert r.status(saga_id) == SagaStatus.COMPLETED
    r.assert_invariants()


def test_a_sleep_until_a_datetime_wakes_then_and_not_before() -> None:
    r = runner()
    until = NOON + timedelta(days=3, hours=4)
    saga_id = r.start(Loan(id="L1", amount=1, sleep_until=until.isoformat()), definition=loan)
    r.run_until_idle()
    r.signal(r.resume_token(saga_id, approval), YES)
    r.run_until_idle()
    assert r.query(saga_id).wait.until_ms == int(until.timestamp() * 1000)  # type: ignore[union-attr]
    r.advance(days=3, hours=3, minutes=59)
    assert r.state(saga_id).wait.step == "cool_off"  # type: ignore[union-attr]
    r.advance(minutes=1)
    assert r.state(saga_id).wait.step == "funds"  # type: ignore[union-attr]


def test_cancel_while_waiting_for_an_event_unregisters_the_wait_and_compensates() -> None:
    r, saga_id = waiting_for_approval()
    r.signal(r.resume_token(saga_id, approval), YES)
    r.advance(hours=1)
    r.cancel(saga_id, reason="customer withdrew")
    r.run_until_idle()
    state = r.state(saga_id)
    assert state.status == SagaStatus.CANCELLED
    assert state.steps["funds"].attempts[-1].outcome == "cancelled"
    unwatched = [e for h in r.history(saga_id) for e in h.effects if type(e).__name__ == "UnwatchEvent"]
    assert len(unwatched) == 1
    r.publish(TREASURY_EVENTS, FundsReady(loan_id="L1", ref="late"))
    r.run_until_idle()
    assert r.status(saga_id) == SagaStatus.CANCELLED
    r.assert_invariants()


def test_force_completing_a_waiting_step_resumes_the_saga() -> None:
    r, saga_id = waiting_for_approval()
    r.force_complete(saga_id, "approval", YES, reason="approved on the phone")
    r.run_until_idle()
    state = r.state(saga_id)
    assert state.steps["approval"].status == StepStatus.SUCCEEDED
    assert [a.outcome for a in state.steps["approval"].attempts] == ["cancelled", "forced"]
    assert state.wait is not None
    assert state.wait.step == "cool_off"
    assert r.timers(saga_id)[0].purpose in ("wake", "deadline")
    r.assert_invariants()


def test_the_deadline_compensates_a_saga_that_runs_too_long() -> None:
    r = runner()
    saga_id = r.start(Trip(id="T1"), definition=trip)
    r.run_until_idle()
    assert r.query(saga_id).deadline_ms == r.now_ms + 7 * 86_400_000
    r.advance(days=7)
    state = r.state(saga_id)
    assert state.status == SagaStatus.COMPENSATED
    assert state.expired is not None
    assert state.expired.what == "deadline exceeded"
    assert state.steps["long_wait"].attempts[0].outcome == "cancelled"
    assert r.timers(saga_id) == []
    r.assert_invariants()


def test_the_deadline_with_nothing_to_undo_fails_the_saga() -> None:
    nap: Saga[Trip] = Saga("nap", context="lending", data=Trip, deadline=timedelta(hours=1))
    nap.sleep("long", timedelta(hours=3))
    r = SagaRunner(nap, start_time=NOON)
    saga_id = r.start(Trip(id="T1"))
    r.advance(hours=1)
    state = r.state(saga_id)
    assert state.status == SagaStatus.FAILED
    assert state.error is not None
    assert state.error.what == "deadline exceeded"


def test_the_deadline_never_assumes_a_silent_step_failed() -> None:
    r = runner()
    r.participant("ledger").on(Reserve, no_reply())
    saga_id = r.start(Trip(id="T1"), definition=trip)
    r.advance(days=8)
    state = r.state(saga_id)  # book may have taken effect: its outcome decides, nothing is undone blind
    assert state.status == SagaStatus.RUNNING
    assert state.expired is not None
    assert r.participant("ledger").received(Release) == []


def test_the_deadline_waits_for_a_step_in_flight_then_compensates() -> None:
    r = runner()
    r.pause("ledger")
    saga_id = r.start(Trip(id="T1"), definition=trip)
    r.run_until_idle()
    r.advance(days=7)
    assert r.status(saga_id) == SagaStatus.RUNNING  # book is in flight: its outcome decides
    assert r.state(saga_id).expired is not None
    r.resume("ledger")
    r.run_until_idle()
    assert r.status(saga_id) == SagaStatus.COMPENSATED
    assert r.participant("ledger").received(Release) == [Release(loan_id="T1")]
    r.assert_invariants()


def test_a_saga_that_ends_in_time_cancels_its_deadline_timer() -> None:
    r = runner()
    saga_id = r.start(Trip(id="T1"), definition=trip)
    r.cancel(saga_id)
    r.run_until_idle()
    assert r.status(saga_id) == SagaStatus.CANCELLED
    assert r.timers(saga_id) == []


def test_replayed_signal_and_timer_events_change_nothing() -> None:
    r, saga_id = waiting_for_approval()
    r.signal(r.resume_token(saga_id, approval), YES)
    r.advance(hours=1)
    r.publish(TREASURY_EVENTS, FundsReady(loan_id="L1", ref="x"))
    r.run_until_idle()
    state = r.state(saga_id)
    for entry in r.history(saga_id)[1:]:
        assert decide(loan, state, entry.event).ignored


def test_a_wait_declared_wrong_is_refused_naming_the_step() -> None:
    saga: Saga[Loan] = Saga("badly_waiting", data=Loan, context="lending")
    with pytest.raises(DefinitionError, match=r"badly_waiting\.back: sleep for a timedelta >= 0"):
        saga.sleep("back", timedelta(seconds=-1))
    with pytest.raises(DefinitionError, match=r"badly_waiting\.naive: sleep until an aware datetime"):
        saga.sleep("naive", datetime(2030, 1, 1))  # noqa: DTZ001 - the mistake under test
    with pytest.raises(DefinitionError, match=r"a computed sleep duration takes one argument, not 2"):
        saga.sleep("computed", lambda data, extra: timedelta(0))
    with pytest.raises(DefinitionError, match=r"badly_waiting\.funds: key must be callable"):
        saga.wait_event("funds", stream=TREASURY_EVENTS, message=FundsReady, key="loan", match=lambda d: d.id)  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match=r"badly_waiting\.funds: message must be a msgspec Struct"):
        saga.wait_event("funds", stream=TREASURY_EVENTS, message=dict, key=lambda e: e, match=lambda d: d.id)


@pytest.mark.parametrize(
    ("until", "error"),
    [
        (
            lambda _loan: datetime(2030, 1, 1),  # noqa: DTZ001 - the mistake under test
            "ValueError: sleep until datetime.datetime(2030, 1, 1, 0, 0): give an aware",
        ),
        (lambda _loan: 5, "TypeError: a sleep lasts a timedelta or ends at a datetime, not int"),
    ],
    ids=["naive-datetime", "not-a-duration"],
)
def test_a_computed_sleep_that_returns_no_duration_fails_its_step(until: Any, error: str) -> None:
    saga: Saga[Loan] = Saga("bad_sleeper", data=Loan, context="lending")
    saga.sleep("nap", until)
    state = SagaRunner(saga).run(LOAN)
    assert state.status == SagaStatus.FAILED
    [attempt] = state.steps["nap"].attempts
    assert attempt.outcome == "permanent"
    assert f"sleep step raised {error}" in (attempt.error or "")
