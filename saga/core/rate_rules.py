"""Commands held for a rate limit or a concurrency slot: the pure half of flow control.

Whether a command may go now is not the decider's to know (it is a bucket shared by every
worker: ``saga/store/rates.py``). The decider sends as it always does; the engine (the
orchestrator, the test runner) takes a token for each command a limit applies to and, when
the token is promised for later, holds the command with :func:`hold`: the decision then
starts a durable ``rate`` timer instead, due when the token is, and the step's record names
that timer (its attempt is made, its command not sent). When the timer fires the decider
sends the attempt (``Commands.send``), unless the saga stopped meanwhile: then the attempt
ends ``cancelled`` without being sent, and the engine gives the token back. The hold is
recorded in the history with the timer, so replay applies it again (:func:`hold_recorded`).

A saga waiting for a concurrency key's slot is held the same way, with a ``slot`` timer
(``saga/runtime/slot_gate.py``): due at its next look at the line, moved to now when a slot
frees for it. Its firing sends the attempt again, which the engine lets go once the saga
holds a slot.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from saga.core.child_messages import CHILD
from saga.core.effects import Dispatch, Effect, StartTimer
from saga.core.model import Attempt, SagaState, StepState
from saga.core.timer_ids import attempt_timer_id
from saga.definition.rate import Limits, RateLimit

Hold = Literal["rate", "slot"]
"""Why a command is held: a rate limit's token, or a concurrency key's slot."""


def held(saga_id: str, key: str, record: StepState, why: Hold = "rate") -> Attempt | None:
    """The attempt of step (or branch) ``key`` whose command waits (for a token), if one does."""
    if record.timer is None or not record.timer.endswith(f":{why}") or not record.attempts:
        return None
    last = record.attempts[-1]
    return last if record.timer == attempt_timer_id(saga_id, key, last.kind, last.n, why) else None


def held_attempts(state: SagaState, why: Hold = "rate") -> Iterable[tuple[str, Attempt]]:
    """Every (record key, attempt) of ``state`` waiting (for a token)."""
    for records in (state.steps, state.branches):
        for key, record in records.items():
            attempt = held(state.id, key, record, why)
            if attempt is not None:
                yield key, attempt


def hold(
    state: SagaState,
    effects: list[Effect],
    dispatch: Dispatch,
    due_ms: int,
    delay_ms: int = 0,
    *,
    why: Hold = "rate",
) -> list[Effect]:
    """Hold ``dispatch`` until ``due_ms`` (Unix ms): the effects with a ``rate`` (or ``why``) timer instead.

    ``delay_ms`` (how far off that is) is for people reading the history; ``due_ms`` decides.

    The attempt's timeout timer, started with the command, is left out too: an attempt's
    timeout counts from when its command is sent. ``state`` is the decision's (its record of
    the step names the new timer).
    """
    key, kind, n = dispatch.step, dispatch.kind, dispatch.attempt
    record = state.branches[key] if "#" in key else state.steps[key]
    timeout = attempt_timer_id(state.id, key, kind, n, "timeout")
    timer = attempt_timer_id(state.id, key, kind, n, why)
    record.timer = timer
    kept = [
        e for e in effects if e is not dispatch and not (isinstance(e, StartTimer) and e.timer_id == timeout)
    ]
    kept.append(
        StartTimer(
            timer_id=timer, delay_ms=delay_ms, purpose=why, step=key, kind=kind, attempt=n, at_ms=due_ms
        )
    )
    return kept


def hold_recorded(state: SagaState, effects: list[Effect], recorded: Iterable[Effect]) -> list[Effect]:
    """``effects`` with the holds a recorded decision made applied again (replay)."""
    for effect in recorded:
        if not isinstance(effect, StartTimer) or effect.at_ms is None:
            continue
        why = effect.purpose
        if why in {"rate", "slot"}:
            for candidate in effects:
                if isinstance(candidate, Dispatch) and (
                    candidate.step,
                    candidate.kind,
                    candidate.attempt,
                ) == (effect.step, effect.kind, effect.attempt):
                    effects = hold(state, effects, candidate, effect.at_ms, effect.delay_ms, why=why)
                    break
    return effects


def released(
    before: SagaState | None, after: SagaState, effects: Iterable[Effect]
) -> list[tuple[str, Attempt]]:
    """The (key, attempt)s held in ``before`` that the decision leading to ``after`` gave up unsent.

    Cancelled, compensated or forced while they waited: their tokens go back to their
    buckets, since a command that never went uses none. (An attempt sent by the decision is
    not given up, even if the engine holds it again.)
    """
    if before is None:
        return []
    sent = {e.command_id for e in effects if isinstance(e, Dispatch)}
    found = []
    for key, attempt in held_attempts(before):
        record = after.branches.get(key) if "#" in key else after.steps.get(key)
        if attempt.command_id not in sent and (record is None or held(after.id, key, record) is None):
            found.append((key, attempt))
    return found


def takes(limits: Limits, state: SagaState, effects: Iterable[Effect]) -> list[tuple[Dispatch, RateLimit]]:
    """The commands of a decision a limit applies to, each with its limit.

    A child saga's start is never limited (the child's own commands are).
    """
    found = []
    for effect in effects:
        if isinstance(effect, Dispatch) and effect.participant != CHILD:
            limit = limits.applying(state.name, effect.step, effect.participant)
            if limit is not None:
                found.append((effect, limit))
    return found


def gives_back(
    limits: Limits, before: SagaState | None, after: SagaState, effects: Iterable[Effect]
) -> list[tuple[Attempt, RateLimit]]:
    """The held attempts a decision gave up (:func:`released`), each with its limit."""
    found = []
    for key, attempt in released(before, after, effects):
        limit = limits.applying(after.name, key, attempt.participant)
        if limit is not None:
            found.append((attempt, limit))
    return found
