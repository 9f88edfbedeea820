"""The decider's rules for operator actions: retry, force-complete and redrive.

Part of the pure decider (``saga/core/decider.py``). An operator moves a stuck saga on:

- **retry** a dead-lettered saga: send its failed compensation, its failed confirmation,
  the branches of its group that ran out of attempts, or its failed step again;
- **force-complete** the step (or branch, or compensation, or confirmation) it is stuck on
  with an output the operator gives, as if it had succeeded;
- **redrive** from a step: its records and those after it start again (``saga/core/redrive.py``
  says when that is refused).

Each leaves the operator's note as ``state.error`` (who, why); the error that stopped the
saga stays in its attempt and the history.
"""

from __future__ import annotations

import msgspec

from saga.core.compensation_rules import CompensationRules
from saga.core.group_rules import GroupRules
from saga.core.model import Attempt, ForceCompleted, Note, RedriveRequested, RetryRequested
from saga.core.redrive import fresh_generation, redrive_refusal
from saga.core.rules import Run
from saga.core.states import SagaStatus, StepStatus, move_saga, move_step
from saga.core.tcc_rules import TccRules
from saga.core.wait_rules import WaitRules

_json = msgspec.json.Encoder()


class OperatorRules:
    """Operator actions, for a decision in progress.

    It calls on the decision (:class:`~saga.core.rules.Run`) and on the rule sets whose
    stuck things it moves on: failed compensations, failed confirmations, groups and waits.
    """

    def __init__(
        self,
        run: Run,
        *,
        waits: WaitRules,
        groups: GroupRules,
        tcc: TccRules,
        undo: CompensationRules,
    ) -> None:
        self.run = run
        self.waits = waits
        self.groups = groups
        self.tcc = tcc
        self.undo = undo

    def on_retry(self, event: RetryRequested) -> None:
        """Retry a dead-lettered saga: send what failed again."""
        if self.run.state.status != SagaStatus.DEAD_LETTERED:
            self.run.ignore(f"retry applies to dead-lettered sagas, this one is {self.run.state.status}")
            return
        self._note("operator retry", event)
        failed_undo = self.undo.failed_compensation()
        if failed_undo is not None:
            cleanup = self.undo.loser_cleanup(failed_undo)
            target = SagaStatus.RUNNING if cleanup else SagaStatus.COMPENSATING
            self.run.state.status = move_saga(self.run.state.status, target)
            self.run.dispatch(failed_undo, "undo")
            return
        failed_confirm = self.tcc.failed_confirmation()
        if failed_confirm is not None:
            self.run.state.status = move_saga(self.run.state.status, SagaStatus.RUNNING)
            self.run.dispatch(failed_confirm, "confirm")
            return
        current = self.run.current_forward()
        if current is None:
            self.run.ignore("no failed step to retry")
            return
        self.run.state.status = move_saga(self.run.state.status, SagaStatus.RUNNING)
        if current[0].is_group and current[1].group is not None:
            if not self.groups.retry_group(current[0]):
                self.run.ignore("no branch of the group ran out of attempts")
            return
        self.run.begin_step(current[0])

    def on_force(self, event: ForceCompleted) -> None:  # noqa: PLR0911, PLR0912 - one case per stuck thing
        """Force-complete what the saga is stuck on with the operator's output."""
        step_state = self.run.record(event.step)
        if step_state is None:
            self.run.ignore(f"no step {event.step!r}")
            return
        if self.run.state.status.terminal:
            self.run.ignore(f"the saga has already ended ({self.run.state.status})")
            return
        step = self.run.bound(event.step)
        self._note("operator force-complete", event, step=event.step)
        forced = Attempt(
            n=len(step_state.attempts) + 1,
            kind="do",
            command_id=event.id,
            participant="operator",
            input_type="ForceCompleted",
            input=msgspec.Raw(_json.encode({"by": event.by, "reason": event.reason})),
            dispatched_ms=event.at_ms,
            ended_ms=event.at_ms,
            outcome="forced",
            output=event.output,
            worker=event.by,
        )
        if step_state.status == StepStatus.COMPENSATION_FAILED:
            forced.kind = "undo"
            step_state.attempts.append(forced)
            step_state.status = move_step(step_state.status, StepStatus.COMPENSATED)
            cleanup = self.undo.loser_cleanup(step)
            target = SagaStatus.RUNNING if cleanup else SagaStatus.COMPENSATING
            self.run.state.status = move_saga(self.run.state.status, target)
            self.undo.after_undo(step)
            return
        if step_state.status == StepStatus.CONFIRM_FAILED:
            forced.kind = "confirm"
            step_state.attempts.append(forced)
            step_state.status = move_step(step_state.status, StepStatus.CONFIRMED)
            self.run.state.status = move_saga(self.run.state.status, SagaStatus.RUNNING)
            self.run.advance()
            return
        if step.is_group:
            self.run.ignore(
                f"force-complete a branch of group {step.name!r} ({step.name}#<index>), not the group"
            )
            return
        if self.run.state.status == SagaStatus.COMPENSATING:
            # The forward path is over; forcing its failed step now would send the next step
            # in the middle of the compensation.
            self.run.ignore("the saga is compensating; only a failed compensation can be force-completed")
            return
        current = self.run.current_forward()
        if current is None or current[0].name != (step.within or event.step):
            self.run.ignore(f"step {event.step!r} is not the step the saga is stuck on")
            return
        if step.within and step_state.status not in (
            StepStatus.FAILED,
            StepStatus.DISPATCHED,
            StepStatus.RETRYING,
        ):
            self.run.ignore(f"branch {event.step!r} is {step_state.status}: nothing to force")
            return
        self.run.cancel_timer(step_state)
        for attempt in step_state.attempts:
            if attempt.outcome is None:
                attempt.outcome, attempt.ended_ms = "cancelled", event.at_ms
        if self.run.state.wait is not None:
            self.waits.release_wait(step_state)
        was_failed = step_state.status == StepStatus.FAILED
        if step_state.status in (StepStatus.DISPATCHED, StepStatus.RETRYING):
            step_state.status = move_step(step_state.status, StepStatus.FAILED)
        step_state.attempts.append(forced)
        if self.run.state.status in (SagaStatus.DEAD_LETTERED, SagaStatus.SUSPENDED):
            self.run.state.status = move_saga(self.run.state.status, SagaStatus.RUNNING)
        if step.within:
            self.groups.force_branch(step, step_state, event.output, was_failed=was_failed)
            return
        self.run.succeeded(step, step_state, event.output)

    def on_redrive(self, event: RedriveRequested) -> None:
        """Run the saga again from a step: its records and the later ones start over."""
        refusal = redrive_refusal(self.run.definition, self.run.state, event.step)
        if refusal:
            self.run.ignore(refusal)
            return
        start = self.run.definition.step_named(event.step)
        self._note("operator redrive", event, step=start.name)
        for step in self.run.definition.steps[start.index :]:
            if self.run.state.steps[step.name].status == StepStatus.PENDING:
                continue
            step_state = self.run.writable(step.name)
            if step_state.status == StepStatus.WAITING and self.run.state.wait is not None:
                step_state.rewait = self.run.state.wait.n  # the wait begins again as itself: next_wait
                self.waits.release_wait(step_state)
            self.run.cancel_timer(step_state)
            for attempt in step_state.attempts:
                if attempt.outcome is None:
                    attempt.outcome, attempt.ended_ms = "cancelled", event.at_ms
            if fresh_generation(step_state):
                step_state.generation += 1
            step_state.status = move_step(step_state.status, StepStatus.PENDING)
            step_state.output = msgspec.Raw(b"null")
        self.run.state.completed = [
            name
            for name in self.run.state.completed
            if self.run.definition.step_named(name).index < start.index
        ]
        self.run.state.cursor = start.index
        self.run.state.status = move_saga(self.run.state.status, SagaStatus.RUNNING)
        self.run.advance()

    def _note(
        self, what: str, event: RetryRequested | ForceCompleted | RedriveRequested, *, step: str = ""
    ) -> None:
        """An operator moved the saga on: their note replaces the last error as ``state.error``.

        The error that stopped the saga stays where it happened (its attempt and the history);
        the saga's note says why it moves again, as after every retry, force-complete and
        redrive.
        """
        self.run.state.error = Note(at_ms=event.at_ms, what=what, by=event.by, reason=event.reason, step=step)
