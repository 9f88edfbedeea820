"""Concurrency keys' slots: the pure half (which commands need a slot, holding them, ends).

A saga with a concurrency key takes a slot of its key's line before it sends its first
command; until it holds one, its first commands are held (:func:`hold_for_slot`) as
``slot`` timers, like a rate limit's (``saga/core/rate_rules.py``). Whether a slot is free
is not the decider's to know: the engine asks the line (``saga/runtime/slot_gate.py``,
the test runner's ``saga/testing/runner_slots.py``) between deciding and committing, and
gives the slot back once the transition that ends the saga has committed (:func:`ended`).
"""

from __future__ import annotations

from collections.abc import Iterable

from saga.core.decision import Decision
from saga.core.effects import Dispatch, Effect
from saga.core.model import SagaState
from saga.core.rate_rules import held, hold
from saga.core.states import SagaStatus
from saga.core.timer_ids import attempt_timer_id


def has_run(state: SagaState | None) -> bool:
    """Whether the saga has sent a command (so it holds its slot, or had one)."""
    if state is None:
        return False
    for records in (state.steps, state.branches):
        for key, record in records.items():
            if record.attempts and held(state.id, key, record, "slot") is None:
                return True
            if len(record.attempts) > 1:
                return True
    return False


def needing_slot(before: SagaState | None, effects: Iterable[Effect]) -> list[Dispatch]:
    """The commands of a decision that may go only once the saga holds a slot.

    Those of a saga that has sent nothing yet: its first commands (a group's branches
    together). A saga that ran before (it holds a slot) sends freely.
    """
    if has_run(before):
        return []
    return [e for e in effects if isinstance(e, Dispatch)]


def slot_timers(state: SagaState, dispatches: Iterable[Dispatch]) -> list[str]:
    """The ids of the ``slot`` timers holding ``dispatches`` (what wakes the saga)."""
    return [attempt_timer_id(state.id, d.step, d.kind, d.attempt, "slot") for d in dispatches]


def hold_for_slot(decision: Decision, dispatches: Iterable[Dispatch], due_ms: int, delay_ms: int) -> None:
    """Hold ``dispatches`` until ``due_ms``: the saga's next look at its line."""
    for dispatch in dispatches:
        decision.effects = hold(decision.state, decision.effects, dispatch, due_ms, delay_ms, why="slot")


def gives_up_slot(status: SagaStatus) -> bool:
    """Whether a saga in ``status`` gives its slot back: ended, or parked for an operator."""
    return status.terminal or status == SagaStatus.DEAD_LETTERED


def ended(before: SagaState | None, after: SagaState) -> bool:
    """Whether the decision from ``before`` to ``after`` ended the saga (its slot goes back)."""
    return gives_up_slot(after.status) and (before is None or not gives_up_slot(before.status))
