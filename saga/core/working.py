"""The saga state a decision changes, with its step and branch records copied on write.

A decision (``saga/core/decider.py``) works on a copy of the saga's state and must leave the
state it was given as it was: replay, the in-process runner and the orchestrator's cache
all hold on to it. Copying every record per decision was most of the copy's price, and a
decision changes one or two of them; so the working copy shares the records with its input
(:meth:`~saga.core.model.SagaState.working_copy`) and :class:`WorkingCopy` copies a record
the first time the decision asks for it to change it. A record the decision left alone is
then the very object of the state before, which the commit's encoder takes as unchanged
without comparing it (``saga/store/codec.py``), as it takes the branch records the decision
did not touch (:attr:`WorkingCopy.touched`).

Rule sets read records through ``state.steps`` and ``state.branches`` and change them only
through :meth:`WorkingCopy.record` or :meth:`WorkingCopy.writable`; ``tests/saga/purity.py``
checks that every decision of the suites that drive them leaves its input unchanged.
"""

from __future__ import annotations

from saga.core.model import SagaState, StepState
from saga.core.states import StepStatus

__all__ = ["WorkingCopy"]


class WorkingCopy:
    """A decision's working copy of the saga state, and the records it owns (copied or new)."""

    def __init__(self, state: SagaState, fresh: bool = False) -> None:
        """``state`` is the working copy; ``fresh``: a new saga's, whose records are all its own."""
        self.state = state
        self._owned: set[str] = set()  # branch records this decision copied or started
        self._own_steps: set[str] = set(state.steps) if fresh else set()  # step records likewise

    @property
    def touched(self) -> frozenset[str]:
        """The branch records this decision may have changed (the commit writes those only)."""
        return frozenset(self._owned)

    def record(self, key: str) -> StepState | None:
        """The record of a step or branch (``<group>#<index>``), ready to be changed.

        The first call for a key puts a copy of the shared record in its place.
        """
        if "#" in key:
            records, owned = self.state.branches, self._owned
        else:
            records, owned = self.state.steps, self._own_steps
        found = records.get(key)
        if found is None or key in owned:
            return found
        copy = records[key] = found.copy()
        owned.add(key)
        return copy

    def writable(self, key: str) -> StepState:
        """The record of a step or branch that has one, ready to be changed (``KeyError`` if none)."""
        found = self.record(key)
        if found is None:
            raise KeyError(key)
        return found

    def add_branch(self, key: str) -> StepState:
        """Start the record of branch ``key`` (scheduled), owned by this decision."""
        record = self.state.branches[key] = StepState(status=StepStatus.SCHEDULED)
        self._owned.add(key)
        return record
