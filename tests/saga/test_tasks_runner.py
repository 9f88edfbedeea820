"""Human tasks on the in-process runner: list, claim, answer and time run past reminders and the SLA."""

from __future__ import annotations

import pytest

from saga.core.states import SagaStatus
from saga.core.task_rules import Notice
from saga.definition.human_tasks import User
from saga.errors import InvalidAnswer, NotAuthorized, TaskAlreadyClaimed, TaskClosed
from saga.runtime.tasks import role_table
from saga.testing import FakeParticipant, SagaRunner, succeed
from tests.saga.purity import check_purity
from tests.saga.task_sagas import Approval, Refund, lenient, refund


@pytest.fixture(autouse=True)
def _decisions_leave_their_input_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    check_purity(monkeypatch, __name__)


ROLES = {"managers": {"ann", "bob"}, "leads": {"lee"}}


def runner() -> tuple[SagaRunner, FakeParticipant]:
    notices = FakeParticipant("notices", {Notice: succeed()})
    return SagaRunner(
        refund, lenient, participants=[notices], authorize=role_table(ROLES, supervisors="leads")
    ), notices


def test_a_manager_claims_and_answers_and_the_saga_resumes() -> None:
    run, _ = runner()
    saga_id = run.start(Refund(id="r1", amount=500), definition=refund)
    run.run_until_idle()
    assert run.status(saga_id) == SagaStatus.SUSPENDED
    (task,) = run.tasks(role="managers")
    assert task.title == "Approve refund r1 of 500"
    assert run.tasks(user="ann") == []
    run.tasks.claim(task.id, by="ann")
    with pytest.raises(TaskAlreadyClaimed) as held:
        run.tasks.claim(task.id, by="bob")
    assert held.value.holder == "ann"
    with pytest.raises(NotAuthorized):
        run.tasks.complete(task.id, Approval(approved=True), by="mallory")
    with pytest.raises(InvalidAnswer):
        run.tasks.complete(task.id, {"approved": "maybe"}, by="ann")
    assert run.tasks.show(task.id).rev == task.rev + 1  # the claim only
    run.tasks.complete(task.id, Approval(approved=True, note="ok"), by="ann")
    run.run_until_idle()
    assert run.status(saga_id) == SagaStatus.COMPLETED
    assert bytes(run.state(saga_id).steps["pay"].output) == b'"paid 500"'
    assert [(e.action, e.by) for e in run.tasks.log(saga_id)] == [
        ("opened", "engine"),
        ("claimed", "ann"),
        ("completed", "ann"),
    ]
    with pytest.raises(TaskClosed):
        run.tasks.release(task.id, by="ann")
    run.assert_invariants()


def test_a_claim_expires_on_the_virtual_clock_and_a_release_frees_it_at_once() -> None:
    run, _ = runner()
    run.start(Refund(id="r2", amount=500), definition=refund)
    run.run_until_idle()
    (task,) = run.tasks(role="managers")
    run.tasks.claim(task.id, by="ann")
    run.advance(minutes=16)
    assert run.tasks.claim(task.id, by="bob").holder == "bob"
    run.tasks.release(task.id, by="bob")
    assert run.tasks.claim(task.id, by="ann").holder == "ann"


def test_time_runs_past_the_reminder_and_each_escalation_step_fires_once() -> None:
    run, notices = runner()
    saga_id = run.start(Refund(id="r3", amount=900), definition=refund)
    run.run_until_idle()
    (task,) = run.tasks(role="managers")
    run.advance(hours=3)
    assert [n.kind for n in run.tasks.notices] == ["reminder"]
    run.advance(hours=1)  # due: reassigned to boss, notified, extended by two hours
    assert run.tasks(role="managers") == []
    (escalated,) = run.tasks(user="boss")
    assert escalated.due_ms == task.due_ms + 2 * 3_600_000
    assert [n.kind for n in notices.received(Notice)] == ["reminder", "escalated"]
    run.advance(hours=2)
    assert run.status(saga_id) == SagaStatus.COMPENSATED
    assert [e.action for e in run.tasks.log(saga_id)] == [
        "opened",
        "reminded",
        "escalation: reassigned",
        "escalation: notified",
        "escalation: extended",
        "escalation: failed",
    ]
    run.advance(hours=10)
    assert len(run.tasks.log(saga_id)) == 6  # nothing fires twice
    run.assert_invariants()


def test_a_reassignment_and_a_default_answer_at_the_due_time() -> None:
    run, _ = runner()
    saga_id = run.start(Refund(id="small", amount=20), definition=lenient)
    run.run_until_idle()
    (task,) = run.tasks(user="ann")
    with pytest.raises(NotAuthorized):
        run.tasks.reassign(task.id, User("bob"), by="bob")
    run.tasks.reassign(task.id, User("bob"), by="lee")
    assert [t.id for t in run.tasks(user="bob")] == [task.id]
    run.run_until_settled(saga_id)
    assert run.status(saga_id) == SagaStatus.COMPLETED
    assert run.tasks.show(task.id).answered_by == "escalation"


def test_a_cancelled_saga_withdraws_its_open_task() -> None:
    run, _ = runner()
    saga_id = run.start(Refund(id="r4", amount=500), definition=refund)
    run.run_until_idle()
    (task,) = run.tasks(role="managers")
    run.cancel(saga_id, reason="customer changed their mind")
    run.run_until_idle()
    assert run.status(saga_id) == SagaStatus.CANCELLED
    assert run.tasks.show(task.id).state == "withdrawn"
    assert run.tasks(role="managers") == []
