"""Redrive of a saga that waits (signal, sleep, event), on the in-process runner.

The loan saga reserves, mails a resume token, waits for the approval signal, sleeps an
hour and waits for the treasury's event. A redrive from the waiting step or any earlier
one must neither apply an effect twice nor strand the saga:

- the wait it interrupts begins again as the same wait: the token already mailed still
  resumes it (the step that mailed it is re-run under its key and answered from its first
  result, so no new token goes out), an event registered for it still matches;
- a wait that had ended is not waited for again: it ends at once with what it received;
- a sleep in progress sleeps again from the redrive.

Every run replays exactly from its history and keeps the invariants.
"""

from __future__ import annotations

import msgspec
import pytest

from saga import SagaStatus
from saga.core.decider import decide
from saga.core.model import EventReceived, RedriveRequested
from saga.testing import SagaRunner
from tests.saga.purity import check_purity
from tests.saga.time_sagas import NOON, TREASURY_EVENTS, Approval, AskApproval, FundsReady, Loan, fakes, loan


@pytest.fixture(autouse=True)
def _decisions_leave_their_input_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    check_purity(monkeypatch, __name__)


LOAN = Loan(id="L1", amount=500)
YES = Approval(approved=True, by="ann")
HOUR_MS = 3_600_000


def at(step: str) -> tuple[SagaRunner, str]:
    """A loan suspended at ``step`` (approval, cool_off or funds)."""
    runner = SagaRunner(loan, participants=fakes(), start_time=NOON)
    saga_id = runner.start(LOAN, saga_id="L1")
    runner.run_until_idle()
    if step in ("cool_off", "funds"):
        runner.signal(runner.resume_token(saga_id, "approval"), YES)
        runner.run_until_idle()
    if step == "funds":
        runner.advance(seconds=3_600)
    wait = runner.state(saga_id).wait
    assert wait is not None
    assert wait.step == step
    return runner, saga_id


def finish(runner: SagaRunner, saga_id: str) -> None:
    """Let a loan that waits for funds (or will) get them and complete; check it all."""
    runner.run_until_idle()
    runner.advance(seconds=3_600)  # a sleep begun again at the redrive ends
    runner.publish(TREASURY_EVENTS, FundsReady(loan_id=LOAN.id, ref="wire-1"))
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert runner.replay(saga_id) == runner.state(saga_id)
    runner.assert_invariants()


@pytest.mark.parametrize("step", ["reserve", "ask", "approval"])
def test_a_redrive_at_a_signal_wait_waits_again_for_the_token_already_sent(step: str) -> None:
    runner, saga_id = at("approval")
    [mailed] = runner.participant("mailer").received(AskApproval)
    timeout = runner.timers(saga_id)[0]

    runner.advance(seconds=60)
    runner.redrive(saga_id, step, reason="the mail server lost it")
    runner.run_until_idle()

    state = runner.state(saga_id)
    assert state.status == SagaStatus.SUSPENDED
    assert state.wait is not None
    assert (state.wait.step, state.wait.n) == ("approval", 1)  # the same wait: the same token
    assert runner.resume_token(saga_id, "approval") == mailed.token
    assert [a.outcome for a in state.steps["approval"].attempts] == ["cancelled", None]
    [restarted] = runner.timers(saga_id)
    assert restarted.due_ms == timeout.due_ms + 60_000  # the wait's timeout counts from the redrive
    assert state.error is not None
    assert (state.error.what, state.error.step) == ("operator redrive", step)
    # Re-sent steps carry the same token under the same key: answered from their first result.
    resent = {"reserve": ["ledger", "mailer"], "ask": ["mailer"], "approval": []}[step]
    for name in ("ledger", "mailer"):
        calls = [c for c in runner.participant(name).calls if c.kind == "do"]
        assert [c.outcome for c in calls] == (["ok", "replayed"] if name in resent else ["ok"])
    assert set(runner.participant("mailer").received(AskApproval)) == {mailed}

    runner.signal(mailed.token, YES)
    finish(runner, saga_id)


def test_a_token_delivered_while_the_redriven_saga_re_runs_earlier_steps_is_kept_for_the_wait() -> None:
    runner, saga_id = at("approval")
    [mailed] = runner.participant("mailer").received(AskApproval)
    runner.pause("ledger")
    runner.redrive(saga_id, "reserve")
    runner.run_until_idle()
    assert runner.state(saga_id).steps["approval"].status == "pending"  # reserve is in flight again
    runner.signal(mailed.token, YES)
    runner.run_until_idle()
    runner.resume("ledger")
    runner.run_until_idle()
    state = runner.state(saga_id)
    assert state.wait is not None
    assert state.wait.step == "cool_off"  # the approval was waiting for it: it ended at once
    assert runner.state(saga_id).steps["approval"].output == msgspec.Raw(msgspec.json.encode(YES))
    finish(runner, saga_id)


def test_a_redrive_over_a_signal_that_came_does_not_wait_for_it_again() -> None:
    runner, saga_id = at("cool_off")
    runner.redrive(saga_id, "approval")
    runner.run_until_idle()
    state = runner.state(saga_id)
    assert state.wait is not None
    assert state.wait.step == "cool_off"
    approval = state.steps["approval"]
    assert [a.outcome for a in approval.attempts] == ["ok", "ok"]  # ended at once with the signal
    assert approval.attempts[1].output == approval.attempts[0].output
    finish(runner, saga_id)


@pytest.mark.parametrize("step", ["approval", "cool_off"])
def test_a_redriven_sleep_sleeps_again_from_the_redrive(step: str) -> None:
    runner, saga_id = at("cool_off")
    runner.advance(seconds=1_800)  # half of it slept
    runner.redrive(saga_id, step)
    runner.run_until_idle()
    [wake] = runner.timers(saga_id)
    assert (wake.purpose, wake.due_ms) == ("wake", runner.now_ms + HOUR_MS)
    runner.advance(seconds=1_800)  # when the first sleep would have ended
    assert runner.state(saga_id).wait.step == "cool_off"  # type: ignore[union-attr]
    finish(runner, saga_id)


@pytest.mark.parametrize("step", ["reserve", "cool_off", "funds"])
def test_a_redrive_at_an_event_wait_registers_it_again_and_the_event_resumes_it(step: str) -> None:
    runner, saga_id = at("funds")
    runner.redrive(saga_id, step)
    finish(runner, saga_id)
    assert runner.state(saga_id).steps["funds"].attempts[0].outcome == "cancelled"


def test_an_event_routed_to_the_registration_a_redrive_removed_is_kept_for_the_wait() -> None:
    """Routing may match the old registration before the redrive's unwatch is handled."""
    runner, saga_id = at("funds")
    state = runner.state(saga_id)
    redriven = decide(
        loan, state, RedriveRequested(id="rd", at_ms=runner.now_ms, step="reserve", by="op", reason="r")
    ).state
    assert redriven.steps["funds"].status == "pending"
    event = EventReceived(
        id="ev",
        at_ms=runner.now_ms,
        step="funds",
        n=1,
        event_id="e1",
        message_type="FundsReady",
        payload=msgspec.Raw(msgspec.json.encode(FundsReady(loan_id="L1", ref="wire-0"))),
    )
    kept = decide(loan, redriven, event)
    assert not kept.ignored
    assert kept.state.signals == {"funds:1": event.payload}
    again = decide(loan, kept.state, event)
    assert again.ignored == "duplicate event for funds:1: an earlier one is kept for the wait"


def test_a_redrive_is_refused_from_a_step_after_the_wait() -> None:
    runner, saga_id = at("approval")
    decision = decide(
        loan,
        runner.state(saga_id),
        RedriveRequested(id="rd", at_ms=runner.now_ms, step="cool_off", by="op", reason="r"),
    )
    assert decision.ignored == "step 'cool_off' has not been reached yet (the saga is at approval)"
