"""The decider's rules for TCC (try-confirm/cancel) steps and child sagas' end reports.

Part of the pure decider (``saga/core/decider.py``). A TCC step's *try* is its ``do`` attempt:
a reservation. When it succeeds, a durable ``expiry`` timer starts for what is left of the
reservation's lifetime (counted from the try's dispatch, so the saga gives up no later than
the participant does). Then:

- when every step has succeeded, the saga *confirms* its TCC steps one by one, in order of
  completion (``confirm`` attempts, key ``<saga>:<step>:confirm``, retried by the
  confirmation's policy; the expiry timer is cancelled first). The saga completes when all
  are confirmed; a confirmation that fails for good dead-letters it (a confirmed
  reservation cannot be cancelled, so nothing is compensated). Once confirming has begun,
  a cancel is refused and the deadline changes nothing: the saga is committing;
- when the saga fails or is cancelled before that, the TCC step is compensated like any
  step: its compensation is the *cancel*;
- when the expiry timer fires first, the reservation has lapsed: the saga stops going
  forward and compensates (cancelling the lapsed reservation too: cancels are idempotent
  and participants treat an unknown or expired reservation as cancelled).
"""

from __future__ import annotations

from typing import Any

import msgspec

from saga.core.effects import NotifyParent, StartTimer
from saga.core.group_rules import completed_output
from saga.core.model import Note, StepState
from saga.core.rules import Run
from saga.core.states import SagaStatus, StepStatus
from saga.definition.step import Step

_CONFIRM_BUSY = frozenset({StepStatus.CONFIRMING, StepStatus.CONFIRM_RETRYING, StepStatus.CONFIRM_FAILED})
_CONFIRM_BEGUN = _CONFIRM_BUSY | {StepStatus.CONFIRMED}


class TccRules:
    """TCC steps and child end reports, for a decision in progress.

    It calls on the decision (:class:`~saga.core.rules.Run`): ``dispatch`` (a confirmation)
    and ``stop`` (a reservation expired).
    """

    def __init__(self, run: Run) -> None:
        self.run = run

    # -- try -------------------------------------------------------------------------------

    def start_expiry(self, step: Step[Any, Any], step_state: StepState) -> None:
        """The try succeeded: time the reservation's expiry from the try's dispatch."""
        assert step.tcc is not None  # noqa: S101 - TCC steps only
        attempt = step_state.current("do")
        assert attempt is not None  # noqa: S101 - it just succeeded
        elapsed = max(0, self.run.now_ms - attempt.dispatched_ms)
        timer_id = f"{self.run.state.id}:{step.name}:expiry"
        step_state.timer = timer_id
        self.run.effects.append(
            StartTimer(
                timer_id=timer_id,
                delay_ms=max(0, int(step.tcc.expires_s * 1000) - elapsed),
                purpose="expiry",
                step=step.name,
                kind="do",
                attempt=attempt.n,
            )
        )

    def on_expiry(self, step: Step[Any, Any]) -> None:
        """The reservation lapsed before the saga confirmed it: stop and compensate."""
        assert step.tcc is not None  # noqa: S101 - TCC steps only
        note = Note(
            at_ms=self.run.now_ms,
            what="reservation expired",
            step=step.name,
            reason=f"{step.name} was not confirmed within {step.tcc.expires_s:g}s of its try",
        )
        self.run.state.error = note
        if self.run.state.expired is None:
            self.run.state.expired = note
        self.run.stop()

    # -- confirm ---------------------------------------------------------------------------

    def _tcc_steps(self) -> list[tuple[Step[Any, Any], StepState]]:
        steps = [self.run.definition.step_named(name) for name in self.run.state.completed]
        return [(s, self.run.state.steps[s.name]) for s in steps if s.tcc is not None]

    def confirming(self) -> bool:
        """Whether the saga has begun confirming its TCC steps (past the point of no return)."""
        return any(record.status in _CONFIRM_BEGUN for _, record in self._tcc_steps())

    def continue_confirmations(self) -> bool:
        """Confirm the next TCC step; ``False`` when every one is confirmed (or there is none)."""
        for step, record in self._tcc_steps():
            if record.status in _CONFIRM_BUSY:
                return True
            if record.status == StepStatus.SUCCEEDED:
                self.run.dispatch(step, "confirm")
                return True
        return False

    def failed_confirmation(self) -> Step[Any, Any] | None:
        """The TCC step whose confirmation failed for good (the saga is dead-lettered)."""
        for step, record in self._tcc_steps():
            if record.status == StepStatus.CONFIRM_FAILED:
                return step
        return None

    # -- child sagas -----------------------------------------------------------------------

    def notify_parent(self) -> None:
        """A child saga ended: report its outcome to the parent step waiting for it."""
        status = self.run.state.status
        if status == SagaStatus.COMPLETED:
            names = [s.name for s in self.run.definition.steps if s.name in self.run.state.steps]
            output = completed_output(self.run.definition, self.run.state, names[-1]) if names else b"null"
            self.run.effects.append(NotifyParent(status=status.value, ok=True, output=msgspec.Raw(output)))
            return
        why = self.run.state.error.reason if self.run.state.error else ""
        error = f"child saga {self.run.state.id} ended {status.value}" + (f": {why}" if why else "")
        self.run.effects.append(NotifyParent(status=status.value, ok=False, error=error))
