"""What committed transitions say about sagas and steps, counted as they commit.

The orchestrator calls :meth:`SagaTallies.transition` with the saga as it was and the
decision after every commit (``Orchestrator.transitions``). It compares the two: a saga
that started, ended or was parked for an operator; every attempt that ended in this
decision (its outcome was unset before), with its duration; every compensation that
finished. Labels name contexts, definitions, versions, steps, kinds and outcomes only,
never a saga id; a group step's branches count under the group step's name, so a map over
ten thousand items is one label value. Only plain ints and :class:`~bus._tally.Buckets`
change here (see ``bus/_tally.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from bus._tally import Buckets
from saga._decider import Decision
from saga._model import Attempt, SagaState, StepState
from saga._states import SagaStatus, StepStatus
from saga._timers import Round

_COMPENSATION_ENDS = {StepStatus.COMPENSATED: "compensated", StepStatus.COMPENSATION_FAILED: "failed"}


class SagaTallies:
    """Counts of one worker's committed transitions and fired timers, by label values."""

    def __init__(self) -> None:
        self.started: Counter[tuple[str, str, str]] = Counter()
        """(context, definition, version) -> sagas started."""
        self.ended: Counter[tuple[str, str, str, str]] = Counter()
        """(context, definition, version, status) -> sagas that reached an end."""
        self.dead_lettered: Counter[tuple[str, str, str]] = Counter()
        """(context, definition, version) -> sagas parked for an operator."""
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
        saga = (after.context, after.name, str(after.version))
        if before is None:
            self.started[saga] += 1
        was = None if before is None else before.status
        if after.status != was:
            if after.status.terminal:
                self.ended[(*saga, after.status.value)] += 1
            elif after.status == SagaStatus.DEAD_LETTERED:
                self.dead_lettered[saga] += 1
        for name, step in after.steps.items():
            self._step(after, name, None if before is None else before.steps.get(name), step)
        for key in decision.touched:
            branch = after.branches.get(key)
            if branch is not None:
                old = None if before is None else before.branches.get(key)
                self._step(after, key.rpartition("#")[0], old, branch)

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
        outcome = _COMPENSATION_ENDS.get(after.status)
        if outcome is not None and (before is None or before.status != after.status):
            self.compensations[(saga.context, saga.name, name, outcome)] += 1


def _ended(before: StepState | None, after: StepState) -> Iterator[Attempt]:
    """The attempts of ``after`` that have an outcome they did not have in ``before``."""
    known = before.attempts if before is not None else []
    aligned = all(
        a.command_id == b.command_id and a.kind == b.kind and a.n == b.n
        for a, b in zip(known, after.attempts, strict=False)
    )
    if not aligned:  # a record begun anew (a group run again): match attempts by identity
        done = {(a.kind, a.n, a.command_id) for a in known if a.outcome is not None}
        yield from (a for a in after.attempts if a.outcome and (a.kind, a.n, a.command_id) not in done)
        return
    for index, attempt in enumerate(after.attempts):
        if attempt.outcome is not None and (index >= len(known) or known[index].outcome is None):
            yield attempt
