"""The decider, driven through the in-process runner: every path of the saga lifecycle (docs/concepts.md).

Each test builds a fresh trip saga (``tests/saga/trips.py``: flight -> hotel -> charge ->
local confirmation, compensations on the first three) and fakes whose behaviour per
command type is the fault under test. Time is virtual: ``advance`` fires exactly the
timers that fall due.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from bus import PermanentError, TransientError
from saga import (
    Command,
    InvalidInput,
    Participant,
    Retry,
    Saga,
    SagaExists,
    SagaNotFound,
    SagaStatus,
    StepStatus,
    command,
)
from saga.core.decider import decide
from saga.core.model import StepReplied
from saga.core.states import move_saga, move_step
from saga.errors import IllegalTransition
from saga.testing import (
    FakeParticipant,
    ReplayMismatch,
    RunnerError,
    SagaRunner,
    duplicate_reply,
    fail,
    fail_transiently,
    late_reply,
    no_reply,
    redeliver,
    replay,
    sequence,
    succeed,
)
from tests.saga.purity import check_purity
from tests.saga.trips import (
    TIMEOUT,
    BookFlight,
    BookHotel,
    CancelFlight,
    CancelHotel,
    Charge,
    Charged,
    Confirmation,
    FlightBooked,
    HotelBooked,
    Refund,
    Trip,
    airline,
    bank,
    define,
    hotel,
)


@pytest.fixture(autouse=True)
def _decisions_leave_their_input_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    check_purity(monkeypatch, __name__)


ANN = Trip(traveller="ann")


class GatewayDown(Exception):
    """A transient-looking error that the trip's retry policy lists as non-retryable."""


def runner_for(*, saga: Saga[Trip] | None = None, **fakes: FakeParticipant) -> SagaRunner:
    participants = {"airline": airline(), "hotel": hotel(), "bank": bank(), **fakes}
    return SagaRunner(saga or define(), participants=participants.values())


def statuses(runner: SagaRunner, saga_id: str) -> dict[str, str]:
    return {name: str(step.status) for name, step in runner.state(saga_id).steps.items()}


def outcomes(runner: SagaRunner, saga_id: str, step: str, kind: str = "do") -> list[str | None]:
    return [a.outcome for a in runner.state(saga_id).steps[step].attempts if a.kind == kind]


def undo_order(runner: SagaRunner) -> list[str]:
    return [c.step for c in runner.calls if c.kind == "undo" and c.outcome == "ok"]


# -- the happy path ------------------------------------------------------------------------


def test_happy_path_completes_each_step_once() -> None:
    runner = runner_for()
    saga_id = runner.start(ANN)
    assert runner.status(saga_id) == SagaStatus.RUNNING
    assert runner.calls == []  # start decides and dispatches; delivery waits for a run
    runner.run_until_idle()

    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert state.completed == ["book_flight", "book_hotel", "charge", "confirm_trip"]
    assert all(s.status == StepStatus.SUCCEEDED and s.count("do") == 1 for s in state.steps.values())
    assert [(c.participant, type(c.message)) for c in runner.calls] == [
        ("airline", BookFlight),
        ("hotel", BookHotel),
        ("bank", Charge),
    ]
    assert [c.idempotency_key for c in runner.calls] == [
        f"{saga_id}:book_flight:do",
        f"{saga_id}:book_hotel:do",
        f"{saga_id}:charge:do",
    ]
    # The local action ran for real and read earlier outputs through ctx.output(step).
    confirmation = msgspec.json.decode(state.steps["confirm_trip"].output, type=Confirmation)
    assert confirmation.summary == f"ann: F-{saga_id} + H-{saga_id}"
    assert runner.timers() == []  # every timeout was cancelled by its reply
    runner.assert_invariants()
    runner.replay(saga_id)


def test_history_records_every_event_with_a_rising_revision() -> None:
    runner = runner_for()
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    history = runner.history(saga_id)
    assert [type(h.event).__name__ for h in history] == ["Started"] + ["StepReplied"] * 4
    assert [h.revision for h in history] == [1, 2, 3, 4, 5]
    assert history[-1].status == SagaStatus.COMPLETED
    assert runner.state(saga_id).revision == 5


def test_run_starts_and_settles_in_one_call() -> None:
    state = runner_for().run(ANN, saga_id="trip-ann")
    assert state.id == "trip-ann"
    assert state.status == SagaStatus.COMPLETED


def test_starting_an_existing_id_returns_it() -> None:
    runner = runner_for()
    first = runner.start(ANN, saga_id="same")
    assert runner.start(Trip(traveller="bob"), saga_id="same") == first
    assert len(runner.saga_ids) == 1
    other: Saga[Trip] = Saga("other", data=Trip, context="travel")
    other.step(reply=FlightBooked, name="never_runs")(lambda data: None)
    both = SagaRunner(define(), other, participants=[airline(), hotel(), bank()])
    both.start(ANN, definition=both.registry.latest("trip"), saga_id="x")
    with pytest.raises(SagaExists, match="runs trip@1"):
        both.start(ANN, definition=other, saga_id="x")


def test_invalid_data_is_refused_and_nothing_starts() -> None:
    runner = runner_for()
    with pytest.raises(InvalidInput, match="not a valid Trip"):
        runner.start({"traveller": 3})
    assert runner.saga_ids == []


# -- transient failures and back-off --------------------------------------------------------


def test_transient_failures_are_retried_after_the_policy_back_off() -> None:
    runner = runner_for(airline=airline(BookFlight=fail_transiently(times=2)))
    saga_id = runner.start(ANN)
    t0 = runner.now_ms
    runner.run_until_idle()
    assert runner.state(saga_id).steps["book_flight"].status == StepStatus.RETRYING
    [timer] = runner.timers(saga_id)
    assert (timer.purpose, timer.step, timer.attempt, timer.due_ms) == ("retry", "book_flight", 1, t0 + 1000)

    runner.advance(seconds=0.999)
    assert outcomes(runner, saga_id, "book_flight") == ["transient"]  # not due yet
    runner.advance(seconds=0.001)
    assert outcomes(runner, saga_id, "book_flight") == ["transient", "transient"]
    [timer] = runner.timers(saga_id)
    assert timer.due_ms == t0 + 1000 + 2000  # exponential: initial 1s, then 2s

    runner.advance(seconds=2)
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    attempts = state.steps["book_flight"].attempts
    assert [a.dispatched_ms - t0 for a in attempts] == [0, 1000, 3000]
    assert [a.outcome for a in attempts] == ["transient", "transient", "ok"]
    assert attempts[0].error == "TransientError: temporarily unavailable"
    runner.assert_invariants()


def test_jittered_back_off_is_deterministic_per_saga_and_within_bounds() -> None:
    policy = Retry(attempts=4, initial=10, backoff=3, max_delay=50, jitter=0.5)
    saga: Saga[Trip] = Saga("jittery", context="travel", data=Trip)

    @saga.step(reply=FlightBooked, retry=policy)
    def fly(data: Trip) -> Command:
        return command("airline", BookFlight(traveller=data.traveller))

    runner = SagaRunner(saga, participants=[airline(BookFlight=fail_transiently(times=3))])
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    delays = []
    for failed in (1, 2, 3):
        [timer] = runner.timers(saga_id)
        delay = timer.due_ms - runner.now_ms
        base = min(50.0, 10 * 3 ** (failed - 1)) * 1000
        assert base * 0.5 <= delay <= base
        assert delay == policy.delay_ms(failed, f"{saga_id}:fly:do")
        delays.append(delay)
        runner.advance(timedelta(milliseconds=delay))
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert len(set(delays)) == 3


def test_advance_fires_timers_set_during_the_advance() -> None:
    runner = runner_for(airline=airline(BookFlight=fail_transiently(times=2)))
    saga_id = runner.start(ANN)
    runner.advance(minutes=1)  # 1s back-off, then a 2s one set by the second failure: both fire
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert runner.now_ms - runner.state(saga_id).created_ms == 60_000


def test_retries_exhausted_dead_letter_the_saga_by_default() -> None:
    runner = runner_for(hotel=hotel(BookHotel=fail_transiently(times=99)))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.DEAD_LETTERED
    assert outcomes(runner, saga_id, "book_hotel") == ["transient"] * 3
    assert state.steps["book_hotel"].status == StepStatus.FAILED
    assert state.steps["book_flight"].status == StepStatus.SUCCEEDED  # parked, not undone
    assert state.error is not None
    assert state.error.step == "book_hotel"
    assert "do attempt 3 transient" in state.error.what
    assert runner.timers() == []
    runner.assert_invariants()


def test_retries_exhausted_compensate_with_on_exhausted_compensate() -> None:
    runner = runner_for(saga=define(on_exhausted="compensate"), bank=bank(Charge=fail_transiently(times=99)))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    assert outcomes(runner, saga_id, "charge") == ["transient"] * 3
    assert undo_order(runner) == ["book_hotel", "book_flight"]
    runner.assert_invariants()


def test_a_non_retryable_error_type_fails_the_step_at_once() -> None:
    runner = runner_for(airline=airline(BookFlight=fail_transiently(times=5, error=GatewayDown("503"))))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.FAILED
    [attempt] = runner.state(saga_id).steps["book_flight"].attempts
    assert (attempt.outcome, attempt.error) == ("permanent", "GatewayDown: 503")


def test_timeouts_count_as_transient_failures() -> None:
    runner = runner_for(hotel=hotel(BookHotel=no_reply(times=2)))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.state(saga_id).steps["book_hotel"].status == StepStatus.DISPATCHED
    [timer] = runner.timers(saga_id)
    assert (timer.purpose, timer.due_ms - runner.now_ms) == ("timeout", TIMEOUT * 1000)

    runner.advance(seconds=TIMEOUT)
    assert outcomes(runner, saga_id, "book_hotel") == ["timeout"]
    assert runner.state(saga_id).steps["book_hotel"].attempts[0].error == "no reply within 30s"
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert outcomes(runner, saga_id, "book_hotel") == ["timeout", "timeout", "ok"]
    assert [c.outcome for c in runner.participant("hotel").calls] == ["lost", "lost", "ok"]


def test_timeouts_exhausted_dead_letter() -> None:
    runner = runner_for(bank=bank(Charge=no_reply()))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.DEAD_LETTERED
    assert outcomes(runner, saga_id, "charge") == ["timeout"] * 3


def test_a_command_that_is_never_answered_and_has_no_timeout_waits() -> None:
    saga: Saga[Trip] = Saga("patient", context="travel", data=Trip)

    @saga.step(reply=FlightBooked)
    def book_flight(data: Trip) -> Any:
        from saga import command

        return command("airline", BookFlight(traveller=data.traveller))

    runner = SagaRunner(saga, participants=[airline(BookFlight=no_reply())])
    saga_id = runner.start(ANN)
    runner.run_until_settled()  # returns: nothing left that could happen
    assert runner.status(saga_id) == SagaStatus.RUNNING
    assert runner.state(saga_id).steps["book_flight"].status == StepStatus.DISPATCHED


# -- permanent failures and compensation ----------------------------------------------------


def test_permanent_failure_at_the_first_step_fails_with_nothing_to_undo() -> None:
    runner = runner_for(airline=airline(BookFlight=fail("no seats")))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.FAILED
    assert statuses(runner, saga_id) == {
        "book_flight": "failed",
        "book_hotel": "pending",
        "charge": "pending",
        "confirm_trip": "pending",
    }
    assert state.steps["book_flight"].attempts[0].error == "no seats"
    assert all(c.kind == "do" for c in runner.calls)
    runner.assert_invariants()


def test_permanent_failure_at_the_second_step_undoes_the_first() -> None:
    runner = runner_for(hotel=hotel(BookHotel=fail("fully booked")))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    assert statuses(runner, saga_id)["book_flight"] == "compensated"
    assert statuses(runner, saga_id)["book_hotel"] == "failed"
    assert runner.participant("airline").received(CancelFlight) == [CancelFlight(booking=f"F-{saga_id}")]
    assert runner.participant("hotel").received(CancelHotel) == []
    runner.assert_invariants()


def test_permanent_failure_at_the_third_step_undoes_in_reverse_order() -> None:
    runner = runner_for(bank=bank(Charge=fail("card declined")))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    assert undo_order(runner) == ["book_hotel", "book_flight"]
    assert runner.summary(saga_id).compensated == ("book_hotel", "book_flight")
    assert statuses(runner, saga_id) == {
        "book_flight": "compensated",
        "book_hotel": "compensated",
        "charge": "failed",
        "confirm_trip": "pending",
    }
    assert runner.participant("bank").received(Refund) == []  # the failed step is not undone
    runner.assert_invariants()


def test_a_failing_local_action_compensates_every_command_step() -> None:
    async def broken(_data: Trip) -> Confirmation:
        raise PermanentError("printer on fire")

    runner = runner_for(saga=define(confirm=broken))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    assert undo_order(runner) == ["charge", "book_hotel", "book_flight"]
    [attempt] = runner.state(saga_id).steps["confirm_trip"].attempts
    assert (attempt.participant, attempt.outcome) == ("_local", "permanent")


def test_a_local_action_failing_transiently_is_retried() -> None:
    calls = {"n": 0}

    async def flaky(_data: Trip) -> Confirmation:
        calls["n"] += 1
        if calls["n"] == 1:
            raise TransientError("disk busy")
        return Confirmation(summary="ok")

    runner = runner_for(saga=define(confirm=flaky))
    state = runner.run(ANN)
    assert state.status == SagaStatus.COMPLETED
    assert outcomes(runner, state.id, "confirm_trip") == ["transient", "ok"]


def test_a_compensation_failing_transiently_is_retried_then_succeeds() -> None:
    runner = runner_for(
        bank=bank(Charge=fail("declined")),
        hotel=hotel(CancelHotel=fail_transiently(times=2)),
    )
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPENSATING
    assert runner.state(saga_id).steps["book_hotel"].status == StepStatus.COMPENSATION_RETRYING
    [timer] = runner.timers(saga_id)
    assert (timer.purpose, timer.kind, timer.due_ms - runner.now_ms) == ("retry", "undo", 1000)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    assert outcomes(runner, saga_id, "book_hotel", "undo") == ["transient", "transient", "ok"]
    assert undo_order(runner) == ["book_hotel", "book_flight"]
    runner.assert_invariants()


def test_a_compensation_failing_for_good_dead_letters_the_saga() -> None:
    runner = runner_for(
        bank=bank(Charge=fail("declined")),
        hotel=hotel(CancelHotel=fail("booking is locked")),
    )
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.DEAD_LETTERED
    assert state.steps["book_hotel"].status == StepStatus.COMPENSATION_FAILED
    assert state.steps["book_flight"].status == StepStatus.SUCCEEDED  # never undone past the failure
    assert runner.participant("airline").received(CancelFlight) == []
    assert state.error is not None
    assert state.error.reason == "booking is locked"
    runner.assert_invariants()


def test_a_compensation_running_out_of_retries_dead_letters_the_saga() -> None:
    runner = runner_for(bank=bank(Charge=fail("declined")), hotel=hotel(CancelHotel=no_reply()))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.DEAD_LETTERED
    assert outcomes(runner, saga_id, "book_hotel", "undo") == ["timeout"] * 3


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_while_a_step_is_dispatched_waits_for_it_then_undoes_it_too() -> None:
    runner = runner_for()
    saga_id = runner.start(ANN)
    runner.cancel(saga_id, reason="changed plans")  # queued behind the flight booking
    runner.run_until_idle()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.CANCELLED
    assert state.cancel is not None
    assert state.cancel.reason == "changed plans"
    # The flight command was in flight: its success was awaited, then undone; nothing else ran.
    assert outcomes(runner, saga_id, "book_flight") == ["ok"]
    assert outcomes(runner, saga_id, "book_flight", "undo") == ["ok"]
    assert statuses(runner, saga_id)["book_hotel"] == "pending"
    runner.assert_invariants()


def test_cancel_mid_saga_undoes_the_completed_steps_in_reverse() -> None:
    runner = runner_for(bank=bank(Charge=no_reply(times=1)))
    saga_id = runner.start(ANN)
    runner.run_until_idle()  # flight and hotel done, the charge is unanswered
    runner.cancel(saga_id)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.RUNNING  # still waiting for the charge
    runner.advance(seconds=TIMEOUT)  # the charge times out: its outcome is unknown...
    runner.run_until_settled()  # ...so it is tried again to learn it, then everything is undone
    assert runner.status(saga_id) == SagaStatus.CANCELLED
    assert outcomes(runner, saga_id, "charge") == ["timeout", "ok"]
    assert undo_order(runner) == ["charge", "book_hotel", "book_flight"]
    runner.assert_invariants()


def test_cancel_while_retrying_stops_the_retry_and_compensates() -> None:
    runner = runner_for(hotel=hotel(BookHotel=fail_transiently(times=5)))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.state(saga_id).steps["book_hotel"].status == StepStatus.RETRYING
    assert len(runner.timers(saga_id)) == 1
    runner.cancel(saga_id)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.CANCELLED
    assert runner.timers(saga_id) == []  # the back-off timer was cancelled
    assert statuses(runner, saga_id)["book_hotel"] == "failed"
    assert outcomes(runner, saga_id, "book_hotel") == ["transient"]
    assert undo_order(runner) == ["book_flight"]
    runner.advance(hours=1)
    assert outcomes(runner, saga_id, "book_hotel") == ["transient"]  # no retry afterwards


def test_cancel_when_the_in_flight_step_fails_transiently_does_not_retry() -> None:
    runner = runner_for(airline=airline(BookFlight=fail_transiently(times=1)))
    saga_id = runner.start(ANN)
    runner.cancel(saga_id)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.CANCELLED  # nothing had completed
    assert outcomes(runner, saga_id, "book_flight") == ["transient"]
    assert runner.timers() == []


def test_cancel_after_the_end_is_recorded_and_ignored() -> None:
    runner = runner_for()
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    before = runner.state(saga_id)
    runner.cancel(saga_id)
    runner.run_until_idle()
    after = runner.state(saga_id)
    assert after == before
    last = runner.history(saga_id)[-1]
    assert last.ignored == "the saga has already ended (completed)"
    assert last.revision == before.revision
    assert last.effects == []


def test_cancel_twice_is_ignored_the_second_time() -> None:
    runner = runner_for(bank=bank(Charge=no_reply(times=1)))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    runner.cancel(saga_id)
    runner.cancel(saga_id)
    runner.run_until_idle()
    assert [h.ignored for h in runner.history(saga_id)][-1] == "cancel was already requested"


def test_cancel_while_compensating_is_recorded_and_the_saga_ends_compensated() -> None:
    runner = runner_for(
        bank=bank(Charge=fail("declined")), hotel=hotel(CancelHotel=fail_transiently(times=1))
    )
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPENSATING
    runner.cancel(saga_id)
    runner.run_until_settled()
    state = runner.state(saga_id)
    assert state.cancel is not None  # recorded...
    assert state.status == SagaStatus.CANCELLED  # ...and the end says a cancel was asked
    assert undo_order(runner) == ["book_hotel", "book_flight"]


def test_cancel_an_unknown_saga_is_an_error() -> None:
    with pytest.raises(SagaNotFound):
        runner_for().cancel("nope")


# -- duplicate, late and redelivered replies ------------------------------------------------


def test_duplicate_replies_are_recorded_as_ignored_and_change_nothing() -> None:
    runner = runner_for(hotel=hotel(BookHotel=duplicate_reply()))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    history = runner.history(saga_id)
    ignored = [h for h in history if h.ignored]
    assert [h.ignored for h in ignored] == ["duplicate reply to book_hotel/do attempt 1 (ok)"]
    [dup] = ignored
    previous = history[history.index(dup) - 1]
    assert dup.revision == previous.revision
    assert dup.effects == []
    assert outcomes(runner, saga_id, "book_hotel") == ["ok"]
    runner.assert_invariants()


def test_a_late_reply_after_a_timeout_is_ignored_and_the_retry_gets_the_first_result() -> None:
    runner = runner_for(bank=bank(Charge=late_reply()))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.participant("bank").effects(Charge)  # the charge happened...
    assert runner.status(saga_id) == SagaStatus.RUNNING  # ...but its reply is held back
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert outcomes(runner, saga_id, "charge") == ["timeout", "ok"]
    # The retry reached the idempotent consumer, which answered with the first result.
    assert [c.outcome for c in runner.participant("bank").calls] == ["ok", "replayed"]
    ignored = [h.ignored for h in runner.history(saga_id) if h.ignored]
    assert ignored == ["late reply to charge/do attempt 1 (timeout)"]
    runner.participant("bank").assert_each_effect_once()
    runner.assert_invariants()


def test_a_late_reply_from_an_earlier_attempt_is_ignored_after_a_retry() -> None:
    # attempt 1 fails transiently but its (stale) success arrives after attempt 2 was sent
    runner = runner_for(hotel=hotel(BookHotel=sequence(no_reply(), succeed(HotelBooked(booking="H-2")))))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert msgspec.json.decode(state.steps["book_hotel"].output, type=HotelBooked).booking == "H-2"

    # Now deliver attempt 1's reply by hand, as a reply that lost a long race.
    late = StepReplied(
        id="late-1",
        at_ms=runner.now_ms,
        step="book_hotel",
        kind="do",
        attempt=1,
        command_id=state.steps["book_hotel"].attempts[0].command_id,
        ok=True,
        output=msgspec.Raw(b'{"type":"HotelBooked","booking":"H-1"}'),
    )
    decision = decide(runner.registry.latest("trip"), state, late)
    assert decision.ignored == "late reply to book_hotel/do attempt 1; current is attempt 2"
    assert decision.effects == []


def test_a_timed_out_charge_that_took_effect_is_refunded_when_the_saga_is_cancelled() -> None:
    # The bank charged the card but its reply came after the timeout; meanwhile the saga was
    # cancelled. The timed-out step is retried anyway: the idempotent consumer answers with
    # the recorded charge, which is then refunded. Found by test_properties.py.
    runner = runner_for(bank=bank(Charge=late_reply()))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.participant("bank").effects(Charge)  # the charge happened
    runner.cancel(saga_id)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.CANCELLED
    assert runner.participant("bank").received(Refund), "the charge was never refunded"


def test_a_participant_that_is_down_times_out_then_works_through_its_backlog() -> None:
    runner = runner_for()
    runner.pause("hotel")
    saga_id = runner.start(ANN)
    runner.advance(seconds=TIMEOUT)  # attempt 1 times out; its retry is 1 s away
    assert outcomes(runner, saga_id, "book_hotel") == ["timeout"]
    assert runner.participant("hotel").calls == []
    runner.resume("hotel")
    runner.run_until_idle()  # attempt 1 is handled now: it takes effect, its reply is late
    assert [c.outcome for c in runner.participant("hotel").calls] == ["ok"]
    assert runner.history(saga_id)[-1].ignored == "late reply to book_hotel/do attempt 1 (timeout)"
    runner.run_until_settled()  # attempt 2 gets the recorded result from the idempotent consumer
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert outcomes(runner, saga_id, "book_hotel") == ["timeout", "ok"]
    assert [c.outcome for c in runner.participant("hotel").calls] == ["ok", "replayed"]
    runner.assert_invariants()


def test_the_idempotent_consumer_forgets_a_result_after_the_dedupe_ttl() -> None:
    # As on Redis: a first result is kept BusConfig.dedupe_ttl_s (a day by default). Retrying
    # a step whose last attempt took effect (its reply came too late) gets that result back
    # within the window; later, the participant runs the command again -- participants that
    # must never repeat an effect need their own inbox (relay/).
    runner = runner_for(bank=bank(Charge=sequence(no_reply(), no_reply(), late_reply(times=99))))
    soon, later = runner.start(ANN, saga_id="soon"), runner.start(Trip(traveller="bob"), saga_id="later")
    runner.run_until_settled()
    for saga_id in (soon, later):
        assert runner.status(saga_id) == SagaStatus.DEAD_LETTERED
        assert [c.outcome for c in runner.participant("bank").calls if c.saga_id == saga_id] == [
            "lost",
            "lost",
            "ok",
        ]

    runner.advance(hours=23)
    runner.retry(soon)
    runner.run_until_settled(soon)
    assert runner.status(soon) == SagaStatus.COMPLETED
    assert [c.outcome for c in runner.participant("bank").calls if c.saga_id == soon][-1] == "replayed"

    runner.advance(days=2)
    runner.retry(later)
    runner.run_until_settled(later)
    assert [c.outcome for c in runner.participant("bank").calls if c.saga_id == later][
        -1
    ] == "ok"  # charged again
    with pytest.raises(AssertionError, match=r"more than once: \['later:charge:do'\]"):
        runner.participant("bank").assert_each_effect_once()


def test_a_redelivered_command_runs_the_handler_once() -> None:
    runner = runner_for(airline=airline(BookFlight=redeliver()))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPLETED
    assert [c.outcome for c in runner.participant("airline").calls if c.kind == "do"] == ["ok", "replayed"]
    assert len(runner.participant("airline").effects(BookFlight)) == 1
    assert [h.ignored for h in runner.history(saga_id) if h.ignored] == [
        "duplicate reply to book_flight/do attempt 1 (ok)"
    ]


def test_without_an_idempotent_consumer_a_redelivery_applies_the_effect_twice() -> None:
    # What the bus's dedupe buys: the same fault, with a participant that does not dedupe.
    fake = FakeParticipant(
        "airline",
        {BookFlight: redeliver(succeed(FlightBooked(booking="F"))), CancelFlight: succeed()},
        idempotent=False,
    )
    runner = runner_for(airline=fake)
    runner.run(ANN)
    assert len(fake.effects(BookFlight)) == 2
    with pytest.raises(AssertionError, match="applied these effects more than once"):
        runner.assert_invariants()


def test_replies_in_random_order_still_end_correctly() -> None:
    for seed in range(20):
        runner = SagaRunner(
            define(),
            participants=[
                airline(BookFlight=duplicate_reply()),
                hotel(CancelHotel=redeliver()),
                bank(Charge=fail("declined")),
            ],
            reorder=random.Random(seed),
        )
        ids = [runner.start(Trip(traveller=f"t{n}")) for n in range(3)]
        runner.cancel(ids[0])
        runner.run_until_settled()
        assert runner.status(ids[0]) == SagaStatus.CANCELLED
        assert [runner.status(i) for i in ids[1:]] == [SagaStatus.COMPENSATED] * 2
        runner.assert_invariants()


# -- operator actions -------------------------------------------------------------------------


def test_operator_retry_resumes_a_dead_lettered_step() -> None:
    hotel_fake = hotel(BookHotel=fail_transiently(times=3))
    runner = runner_for(hotel=hotel_fake)
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.DEAD_LETTERED
    runner.retry(saga_id, reason="hotel API is back", by="ops")
    runner.run_until_settled()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert outcomes(runner, saga_id, "book_hotel") == ["transient"] * 3 + ["ok"]
    assert state.error is not None
    assert (state.error.what, state.error.by) == ("operator retry", "ops")
    runner.assert_invariants()


def test_operator_retry_that_fails_again_dead_letters_again() -> None:
    runner = runner_for(hotel=hotel(BookHotel=fail_transiently(times=99)))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    runner.retry(saga_id)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.DEAD_LETTERED
    assert outcomes(runner, saga_id, "book_hotel") == ["transient"] * 4  # one more attempt per retry


def test_operator_retry_resumes_a_dead_lettered_compensation() -> None:
    runner = runner_for(
        bank=bank(Charge=fail("declined")),
        hotel=hotel(CancelHotel=fail_transiently(times=3)),
    )
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.DEAD_LETTERED
    runner.retry(saga_id)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    assert undo_order(runner) == ["book_hotel", "book_flight"]
    runner.assert_invariants()


def test_operator_retry_of_a_running_saga_is_ignored() -> None:
    runner = runner_for(bank=bank(Charge=no_reply()))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    runner.retry(saga_id)
    runner.run_until_idle()
    assert runner.history(saga_id)[-1].ignored == "retry applies to dead-lettered sagas, this one is running"


def test_force_complete_moves_a_dead_lettered_step_on() -> None:
    runner = runner_for(hotel=hotel(BookHotel=fail_transiently(times=99)))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    runner.force_complete(saga_id, "book_hotel", HotelBooked(booking="by-phone"), reason="booked by phone")
    runner.run_until_settled()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    hotel_step = state.steps["book_hotel"]
    assert [a.outcome for a in hotel_step.attempts] == ["transient", "transient", "transient", "forced"]
    assert hotel_step.attempts[-1].worker == "test"
    confirmation = msgspec.json.decode(state.steps["confirm_trip"].output, type=Confirmation)
    assert confirmation.summary.endswith("+ by-phone")  # later steps read the forced output
    runner.assert_invariants()


@pytest.mark.parametrize("action", ["retry", "force-complete"])
def test_an_operator_action_replaces_the_failures_note_with_the_operators(action: str) -> None:
    """Retry and force-complete agree: the saga's note says who moved it on and why, while the
    failure that stopped it stays in its attempt (and the history)."""
    runner = runner_for(hotel=hotel(BookHotel=fail_transiently(times=3)))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    failure = runner.state(saga_id).error
    assert failure is not None
    assert (failure.what, failure.step) == ("do attempt 3 transient", "book_hotel")
    if action == "retry":
        runner.retry(saga_id, reason="hotel API is back", by="ops")
    else:
        runner.force_complete(
            saga_id, "book_hotel", HotelBooked(booking="x"), reason="hotel API is back", by="ops"
        )
    runner.run_until_settled()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert state.error is not None
    assert (state.error.what, state.error.by, state.error.reason) == (
        f"operator {action}",
        "ops",
        "hotel API is back",
    )
    assert state.steps["book_hotel"].attempts[2].error == failure.reason


def test_force_complete_a_stuck_running_step() -> None:
    runner = runner_for(bank=bank(Charge=no_reply()))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    runner.force_complete(saga_id, "charge", Charged(charge="manual"), reason="charged by hand")
    runner.run_until_idle()
    state = runner.state(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert [a.outcome for a in state.steps["charge"].attempts] == ["cancelled", "forced"]
    assert runner.timers() == []  # the attempt's timeout was cancelled


def test_force_complete_a_failed_compensation_continues_compensating() -> None:
    runner = runner_for(
        bank=bank(Charge=fail("declined")),
        hotel=hotel(CancelHotel=fail("locked")),
    )
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    runner.force_complete(saga_id, "book_hotel", HotelBooked(booking="x"), reason="cancelled by phone")
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    assert outcomes(runner, saga_id, "book_hotel", "undo") == ["permanent", "forced"]
    assert runner.participant("airline").received(CancelFlight)  # the next compensation ran
    runner.assert_invariants()


def test_force_complete_the_failed_step_while_compensating_is_ignored() -> None:
    # Found by this suite: it used to restart the forward path in the middle of the
    # compensation (dispatching the next step), and the next reply then raised
    # IllegalTransition(compensating -> completed) in the orchestrator.
    runner = runner_for(bank=bank(Charge=fail("declined")), hotel=hotel(CancelHotel=no_reply()))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.COMPENSATING
    runner.force_complete(saga_id, "charge", Charged(charge="forced"), reason="late fix")
    runner.run_until_idle()
    assert runner.history(saga_id)[-1].ignored.startswith("the saga is compensating")
    assert runner.state(saga_id).steps["confirm_trip"].status == StepStatus.PENDING
    runner.force_complete(saga_id, "book_hotel", HotelBooked(booking="x"), reason="stuck undo")
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.DEAD_LETTERED  # the undo timed out for good
    runner.force_complete(saga_id, "book_hotel", HotelBooked(booking="x"), reason="undone by phone")
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.COMPENSATED
    runner.assert_invariants()


def test_force_complete_checks_the_output_type() -> None:
    runner = runner_for(bank=bank(Charge=no_reply()))
    saga_id = runner.start(ANN)
    with pytest.raises(InvalidInput, match="not a valid Charged"):
        runner.force_complete(saga_id, "charge", HotelBooked(booking="x"))


def test_force_complete_after_the_end_is_ignored() -> None:
    runner = runner_for()
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    runner.force_complete(saga_id, "charge", Charged(charge="x"))
    runner.run_until_idle()
    assert runner.history(saga_id)[-1].ignored == "the saga has already ended (completed)"


def test_cancel_a_dead_lettered_saga_compensates_it() -> None:
    runner = runner_for(bank=bank(Charge=fail_transiently(times=99)))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.DEAD_LETTERED
    runner.cancel(saga_id, reason="give up")
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.CANCELLED
    assert undo_order(runner) == ["book_hotel", "book_flight"]


def test_cancel_a_saga_dead_lettered_in_compensation_retries_the_compensation() -> None:
    runner = runner_for(
        bank=bank(Charge=fail("declined")), hotel=hotel(CancelHotel=fail_transiently(times=3))
    )
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    runner.cancel(saga_id)
    runner.run_until_settled()
    assert runner.status(saga_id) == SagaStatus.CANCELLED
    assert undo_order(runner) == ["book_hotel", "book_flight"]


# -- the state machine ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (SagaStatus.COMPLETED, SagaStatus.RUNNING),
        (SagaStatus.RUNNING, SagaStatus.COMPENSATED),
        (SagaStatus.COMPENSATING, SagaStatus.COMPLETED),
        (SagaStatus.CANCELLED, SagaStatus.COMPENSATING),
        (SagaStatus.FAILED, SagaStatus.DEAD_LETTERED),
    ],
)
def test_illegal_saga_transitions_raise(source: SagaStatus, target: SagaStatus) -> None:
    with pytest.raises(IllegalTransition, match=f"illegal saga transition {source} -> {target}"):
        move_saga(source, target)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (StepStatus.PENDING, StepStatus.SUCCEEDED),
        (StepStatus.SUCCEEDED, StepStatus.DISPATCHED),
        (StepStatus.COMPENSATED, StepStatus.COMPENSATING),
        (StepStatus.FAILED, StepStatus.COMPENSATING),
        (StepStatus.RETRYING, StepStatus.SUCCEEDED),
    ],
)
def test_illegal_step_transitions_raise(source: StepStatus, target: StepStatus) -> None:
    with pytest.raises(IllegalTransition, match=f"illegal step transition {source} -> {target}"):
        move_step(source, target)


def test_staying_put_is_always_allowed() -> None:
    assert move_saga(SagaStatus.COMPLETED, SagaStatus.COMPLETED) == SagaStatus.COMPLETED
    assert move_step(StepStatus.COMPENSATED, StepStatus.COMPENSATED) == StepStatus.COMPENSATED


def test_the_decider_raises_instead_of_applying_an_illegal_transition() -> None:
    # A corrupted record: the step claims to be pending while its attempt is in flight.
    runner = runner_for(bank=bank(Charge=no_reply()))
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    state = runner.state(saga_id)
    state.steps["charge"].status = StepStatus.PENDING
    attempt = state.steps["charge"].attempts[0]
    reply = StepReplied(
        id="r",
        at_ms=runner.now_ms,
        step="charge",
        kind="do",
        attempt=1,
        command_id=attempt.command_id,
        ok=True,
        output=msgspec.Raw(b'{"type":"Charged","charge":"c"}'),
    )
    with pytest.raises(IllegalTransition, match="pending -> succeeded"):
        decide(runner.registry.latest("trip"), state, reply)


def test_events_for_unknown_steps_and_second_starts_are_ignored() -> None:
    runner = runner_for(bank=bank(Charge=no_reply()))
    saga_id = runner.start(ANN)
    state = runner.state(saga_id)
    definition = runner.registry.latest("trip")
    stray = StepReplied(id="s", at_ms=0, step="nope", kind="do", attempt=1, command_id="c", ok=True)
    assert decide(definition, state, stray).ignored == "no step 'nope' in trip@1"
    again = runner.history(saga_id)[0].event
    assert decide(definition, state, again).ignored == "the saga has already started"


def test_the_decider_does_not_modify_the_state_it_is_given() -> None:
    runner = runner_for()
    saga_id = runner.start(ANN)
    state = runner.state(saga_id)
    snapshot = msgspec.json.encode(state)
    [dispatch] = [d for s, d in runner.dispatched if s == saga_id]
    reply = StepReplied(
        id="r",
        at_ms=runner.now_ms,
        step="book_flight",
        kind="do",
        attempt=1,
        command_id=dispatch.command_id,
        ok=True,
        output=msgspec.Raw(b'{"type":"FlightBooked","booking":"F"}'),
    )
    decision = decide(runner.registry.latest("trip"), state, reply)
    assert decision.state.status == SagaStatus.RUNNING
    assert msgspec.json.encode(state) == snapshot


# -- the runner itself ------------------------------------------------------------------------


def test_real_participants_plug_in_and_can_be_wrapped_with_faults() -> None:
    from redsaga.examples.contracts import ChargeCard, Line, Order
    from redsaga.examples.orders import order_fulfilment
    from redsaga.examples.stateless import inventory, payments, shipping

    flaky_payments = FakeParticipant.of(payments).on(ChargeCard, fail_transiently(times=2))
    runner = SagaRunner(order_fulfilment, participants=[inventory, flaky_payments, shipping])
    order = Order(id="o-runner-1", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=700)
    state = runner.run(order, saga_id="runner-real-1")
    assert state.status == SagaStatus.COMPLETED
    assert [c.outcome for c in flaky_payments.calls] == ["transient", "transient", "ok"]
    assert [c.participant for c in runner.calls if c.outcome == "ok"] == ["inventory", "payments", "shipping"]
    declined = runner.run(Order(id="o-runner-2", customer="c", lines=[], total_cents=1, card="declined"))
    assert declined.status == SagaStatus.COMPENSATED
    assert declined.steps["charge_payment"].attempts[-1].error == "card declined"


def test_a_missing_participant_is_a_runner_error() -> None:
    runner = SagaRunner(define(), participants=[airline(), hotel()])
    runner.start(ANN)
    with pytest.raises(RunnerError, match="no participant 'bank'"):
        runner.run_until_idle()


def test_a_fake_without_a_behaviour_for_a_command_is_a_runner_error() -> None:
    runner = runner_for(bank=FakeParticipant("bank", {Refund: succeed()}))
    runner.start(ANN)
    with pytest.raises(RunnerError, match="'bank' has no behaviour for Charge"):
        runner.run_until_idle()


def test_a_reply_of_the_wrong_type_is_a_runner_error() -> None:
    runner = runner_for(bank=bank(Charge=succeed(HotelBooked(booking="oops"))))
    runner.start(ANN)
    with pytest.raises(RunnerError, match="expects a Charged reply, got HotelBooked"):
        runner.run_until_idle()


def test_then_defaults_to_the_behaviour_registered_before() -> None:
    fake = FakeParticipant("bank", {Charge: Charged(charge="c")})
    fake.on(Charge, fail_transiently(times=1))
    with pytest.raises(ValueError, match="give then="):
        FakeParticipant("bank", {Charge: fail_transiently(times=1)})
    runner = runner_for(bank=fake.on(Refund, succeed()))
    state = runner.run(ANN)
    assert outcomes(runner, state.id, "charge") == ["transient", "ok"]


def test_output_functions_may_raise_like_handlers() -> None:
    def charge(command: Charge) -> Charged:
        if command.amount > 100:
            raise PermanentError("over the limit")
        return Charged(charge="c")

    runner = runner_for(bank=bank(Charge=succeed(charge)))
    assert runner.run(Trip(traveller="big", amount=101)).status == SagaStatus.COMPENSATED
    assert runner.run(Trip(traveller="small", amount=99)).status == SagaStatus.COMPLETED


def test_the_clock_starts_where_asked_and_only_moves_when_told() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    runner = SagaRunner(define(), participants=[airline(), hotel(), bank()], start_time=start)
    assert runner.now == start
    runner.run(ANN)
    assert runner.now == start
    runner.advance(timedelta(hours=2), minutes=30)
    assert runner.now == start + timedelta(hours=2, minutes=30)
    with pytest.raises(ValueError, match="only moves forward"):
        runner.advance(seconds=-1)


def test_replay_reproduces_the_runner_history_and_catches_a_changed_definition() -> None:
    runner = runner_for(hotel=hotel(BookHotel=fail_transiently(times=2)), bank=bank(Charge=fail("no")))
    saga_id = runner.start(ANN)
    runner.run_until_settled()
    history = runner.history(saga_id)
    final = replay(define(), history, saga_id=saga_id)
    assert final.status == SagaStatus.COMPENSATED
    assert final.revision == runner.state(saga_id).revision
    encoded = msgspec.json.encode(history)  # as exported: one JSON array
    assert replay(define(), encoded, saga_id=saga_id).status == SagaStatus.COMPENSATED

    changed = define(hotel_retry=Retry(attempts=3, initial=5, jitter=0))
    with pytest.raises(ReplayMismatch, match=r"history entry 2 .*effects differ") as differs:
        replay(changed, history, saga_id=saga_id)
    assert (differs.value.saga_id, differs.value.index) == (saga_id, 2)
    assert differs.value.step == differs.value.mismatch.step != ""


@pytest.mark.anyio
async def test_the_runner_works_from_async_tests_too() -> None:
    runner = runner_for(hotel=hotel(BookHotel=fail_transiently(times=1)))
    state = runner.run(ANN)
    assert state.status == SagaStatus.COMPLETED


def test_a_handler_cannot_drive_the_runner_that_runs_it() -> None:
    holder: dict[str, SagaRunner] = {}

    async def reentrant(_command: Charge, _ctx: Any) -> Charged:
        holder["runner"].run_until_idle()
        return Charged(charge="c")

    bank_participant = Participant("bank", serves=["travel"])
    bank_participant.handles(Charge)(reentrant)
    runner = runner_for(bank=FakeParticipant.of(bank_participant).on(Refund, succeed()))
    holder["runner"] = runner
    runner.start(ANN)
    with pytest.raises(RunnerError, match="called from a handler or action it is running"):
        runner.run_until_idle()


def test_a_handler_may_queue_work_for_its_runner() -> None:
    holder: dict[str, SagaRunner] = {}

    async def cancelling(_command: Charge, ctx: Any) -> Charged:
        holder["runner"].cancel(ctx.saga_id, reason="fraud check")
        return Charged(charge="c")

    bank_participant = Participant("bank", serves=["travel"])
    bank_participant.handles(Charge)(cancelling)
    bank_participant.handles(Refund)(lambda c, ctx: _none())
    runner = runner_for(bank=FakeParticipant.of(bank_participant))
    holder["runner"] = runner
    saga_id = runner.start(ANN)
    runner.run_until_idle()
    assert runner.status(saga_id) == SagaStatus.CANCELLED
    assert undo_order(runner) == ["charge", "book_hotel", "book_flight"]


async def _none() -> None:
    return None
