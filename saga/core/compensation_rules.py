"""The decider's rules for compensation: what is undone, in which order, and when it ends.

Part of the pure decider (``saga/core/decider.py``). Compensation undoes what completed in
strict reverse order of completion: a group the saga stopped in comes first (its branches
completed after every completed step), its completed branches latest first; then the earlier
steps that have a compensation. When nothing is left, the saga ends ``compensated`` (or
``cancelled`` after a cancel); when nothing was to undo, ``failed``. A first-of-N loser's
undo runs on the forward path (a clean-up), and its group settles when it ends.
"""

from __future__ import annotations

from typing import Any

from saga.core.group_rules import GroupRules
from saga.core.rules import Run
from saga.core.states import SagaStatus, StepStatus, move_saga, move_step
from saga.definition.step import Step


class CompensationRules:
    """Undoing what completed, for a decision in progress.

    It calls on the decision (:class:`~saga.core.rules.Run`): ``current_forward``, ``bound``
    and ``dispatch`` (an undo), and on the group rules for the branches to undo.
    """

    def __init__(self, run: Run, groups: GroupRules) -> None:
        self.run = run
        self.groups = groups

    def undo_order(self) -> list[str]:
        """Steps to look at for undoing, latest completion first.

        A group the saga stopped in (failed, or closed by a cancel) completed branches after
        every completed step, so it comes first.
        """
        order = list(reversed(self.run.state.completed))
        current = self.run.current_forward()
        if current is not None and current[0].is_group and current[1].group is not None:
            order.insert(0, current[0].name)
        return order

    def begin_compensation(self) -> None:
        """Start undoing what completed; end the saga at once when nothing is to undo."""
        if not any(self._undo_pending(name) for name in self.undo_order()):
            end = SagaStatus.CANCELLED if self.run.state.cancel is not None else SagaStatus.FAILED
            self.run.state.status = move_saga(self.run.state.status, end)
            return
        self.run.state.status = move_saga(self.run.state.status, SagaStatus.COMPENSATING)
        self.continue_compensation()

    def _undo_pending(self, name: str) -> bool:
        step = self.run.definition.step_named(name)
        if step.is_group:
            return self.groups.next_undo(name) is not None or self.groups.undoing(name)
        return step.compensation is not None and self.run.state.steps[name].status == StepStatus.SUCCEEDED

    def continue_compensation(self) -> None:
        """Undo the latest completed step (or branch) not yet undone; end when none is left."""
        for name in self.undo_order():
            step = self.run.definition.step_named(name)
            if step.is_group:
                if self.groups.undoing(name):
                    return  # a first-of-N loser's undo is in flight: its outcome first
                step_state = self.run.writable(name)
                key = self.groups.next_undo(name)
                if key is not None:
                    if step_state.status == StepStatus.SUCCEEDED:
                        step_state.status = move_step(step_state.status, StepStatus.COMPENSATING)
                    self.run.dispatch(self.run.bound(key), "undo")
                    return
                if step_state.status == StepStatus.COMPENSATING:
                    step_state.status = move_step(step_state.status, StepStatus.COMPENSATED)
                continue
            if step.compensation is not None and self.run.state.steps[name].status == StepStatus.SUCCEEDED:
                self.run.dispatch(step, "undo")
                return
        end = SagaStatus.CANCELLED if self.run.state.cancel is not None else SagaStatus.COMPENSATED
        self.run.state.status = move_saga(self.run.state.status, end)

    def after_undo(self, step: Step[Any, Any]) -> None:
        """An undo succeeded: go on compensating, or settle the group of a first-of-N loser.

        A loser's undo runs on the forward path; when it ends, its group settles: the
        clean-up goes on, or -- after a cancel that waited for this undo -- the
        compensation begins.
        """
        if step.within and self.run.state.status != SagaStatus.COMPENSATING:
            self.groups.settle_group(self.run.definition.step_named(step.within))
            return
        self.continue_compensation()

    def loser_cleanup(self, step: Step[Any, Any]) -> bool:
        """Whether undoing ``step`` is a first-of-N clean-up on the forward path."""
        if not step.within or self.run.state.status == SagaStatus.COMPENSATING:
            return False
        group = self.run.state.steps[step.within].group
        return group is not None and group.closed == "won" and not self.run.stopping

    def failed_compensation(self) -> Step[Any, Any] | None:
        """The step or branch whose compensation failed for good (the saga is dead-lettered)."""
        for key, record in self.run.state.branches.items():
            if record.status == StepStatus.COMPENSATION_FAILED:
                return self.run.bound(key)
        for name in self.run.state.completed:
            if self.run.state.steps[name].status == StepStatus.COMPENSATION_FAILED:
                return self.run.definition.step_named(name)
        return None

    def outcome_unknown(self) -> bool:
        """Whether the step (or a branch of the group) the saga is stuck on may have taken effect.

        Its last attempt timed out: then the deadline does not compensate a dead-lettered
        saga blind, an operator decides.
        """
        current = self.run.current_forward()
        if current is not None and current[0].is_group:
            return self.groups.group_outcome_unknown(current[0])
        last = current[1].current("do") if current is not None else None
        return last is not None and last.outcome == "timeout"
