"""What committed transitions say about sagas and steps, counted as they commit.

The orchestrator calls :meth:`SagaTallies.transition` with the saga as it was and the
decision after every commit (``Orchestrator.transitions``). It compares the two: a saga
that started, ended or was parked for an operator; every attempt that ended in this
decision (its outcome was unset before), with its duration; every compensation that
finished. Labels name contexts, definitions, versions, steps, kinds and outcomes only,
never a saga id; a group step's branches count under the group step's name, so a map over
ten thousand items is one label value. Only plain ints and :class:`~bus.metrics.Buckets`
change here (see ``bus/_tally.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from bus.metrics import Buckets
from saga.core.decider import Decision
from saga.core.model import Attempt, SagaState, StepState
from saga.core.states import SETTLED, SagaStatus, StepStatus
from saga.runtime.timer_firing import Round


class SagaTallies:
    """Counts of one worker's committed transitions and fired timers, by label values."""

    def __init__(self) -> None:
        self.started: Counter[tuple[str, str, str]] = Counter()
        """(context, definition, version) -> sagas started."""
        self.ended: Counter[tuple[str, str, str, str]] = Counter()
        """(context, definition, version, status) -> sagas that reached an end."""
        self.dead_lettered: Counter[tuple[str, str, str]] = Counter()
        """(context, definition, version) -> sagas parked for an operator."""
        self.saga_durations: dict[tuple[str, str, str, str], Buckets] = {}
        """(context, definition, version, status) -> how long sagas took from their start to
        their end, or to being parked for an operator (``dead_lettered``)."""
        self.attempts: Counter[tuple[str, str, str, str, str]] = Counter()
        """(context, definition, step, kind, outcome) -> attempts that ended."""
        self.durations: dict[tuple[str, str, str, str, str], Buckets] = {}
        """The same labels -> how long those attempts took, dispatch to outcome."""
        self.compensations: Counter[tuple[str, str, str, str]] = Counter()
        """(context, definition, step, outcome) -> compensations that finished."""
        self.timer_lag = Buckets()
        """How late timers fired, by the timer clock."""

    def transition(self, before: SagaState | None, decision: Decision) -> None:
        """Count what one committed decision changed (an ignored event changes nothing)."""
        if decision.ignored:
            return
        after = decision.state
        if before is None:
            self.started[after.context, after.name, str(after.version)] += 1
        if before is None or after.status != before.status:
            if after.status.terminal:
                self.ended[after.context, after.name, str(after.version), after.status.value] += 1
            elif after.status == SagaStatus.DEAD_LETTERED:
                self.dead_lettered[after.context, after.name, str(after.version)] += 1
            if after.status in SETTLED:
                self._settled(after)
        steps = None if before is None else before.steps
        for name, step in after.steps.items():
            old = None if steps is None else steps.get(name)
            if old is None or old.status is not step.status or len(old.attempts) != len(step.attempts):
                self._step(after, name, old, step)
            elif step.attempts and step.attempts[-1].outcome != old.attempts[-1].outcome:
                self._step(after, name, old, step)  # (unseen: an attempt ends as its step moves)
        for key in decision.touched:
            branch = after.branches.get(key)
            if branch is not None:
                old = None if before is None else before.branches.get(key)
                self._step(after, key.rpartition("#")[0], old, branch)

    def _settled(self, saga: SagaState) -> None:
        labels = (saga.context, saga.name, str(saga.version), saga.status.value)
        buckets = self.saga_durations.get(labels)
        if buckets is None:
            buckets = self.saga_durations[labels] = Buckets()
        buckets.observe(max(0, saga.updated_ms - saga.created_ms) / 1000)

    def timers(self, fired: Round) -> None:
        """Record how late each timer of a scheduler round fired."""
        for lag_ms in fired.lags_ms:
            self.timer_lag.observe(lag_ms / 1000)

    def _step(self, saga: SagaState, name: str, before: StepState | None, after: StepState) -> None:
        for attempt in _ended(before, after):
            labels = (saga.context, saga.name, name, attempt.kind, attempt.outcome or "")
            self.attempts[labels] += 1
            if attempt.ended_ms is not None:
                buckets = self.durations.get(labels)
                if buckets is None:
                    buckets = self.durations[labels] = Buckets()
                buckets.observe(max(0, attempt.ended_ms - attempt.dispatched_ms) / 1000)
        status = after.status  # compared by identity: an enum's hash is a Python call
        if (status is StepStatus.COMPENSATED or status is StepStatus.COMPENSATION_FAILED) and (
            before is None or before.status is not status
        ):
            outcome = "compensated" if status is StepStatus.COMPENSATED else "failed"
            self.compensations[saga.context, saga.name, name, outcome] += 1


def _ended(before: StepState | None, after: StepState) -> Sequence[Attempt]:
    """The attempts of ``after`` that have an outcome they did not have in ``before``.

    A step's attempts only grow, and each begins after the one before it ended (a retry, a
    compensation, a redrive that cancels the attempt in flight), so only ``before``'s last
    attempt and the ones appended since can have ended now: O(1) per step, whatever its
    history. A record begun anew (a group run again) is read as new.
    """
    attempts = after.attempts
    known: Sequence[Attempt] = before.attempts if before is not None else ()
    count = len(known)
    if count > len(attempts) or (count and attempts[count - 1].command_id != known[-1].command_id):
        count = 0
    elif count == len(attempts):  # nothing appended: the common case
        if count and known[-1].outcome is None and attempts[-1].outcome is not None:
            return (attempts[-1],)
        return ()
    ended = [a for a in attempts[count:] if a.outcome is not None]
    if count and known[-1].outcome is None and attempts[count - 1].outcome is not None:
        ended.insert(0, attempts[count - 1])
    return ended
