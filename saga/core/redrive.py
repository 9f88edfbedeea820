"""The rules of an operator redrive: re-running a stuck saga from one of its steps.

A redrive keeps the outputs of the steps before ``step`` and runs ``step`` and every later
step again, in order. It must never apply an effect twice, and never build on an output
whose effect was undone, so it is allowed only:

- while the saga runs, waits or is dead-lettered on a forward step (an ended saga stays
  ended: start a new one), with no cancel requested and no compensation begun;
- from a step the saga has reached (later steps never ran: there is nothing to redrive).

Idempotency decides what "again" means for each re-run step. A step whose every attempt
failed by reply is known to have had no effect: it gets a new idempotency-key generation,
so a participant that remembered the failure runs the (fixed) code again. Any other step
(it succeeded, or an attempt is in flight or timed out, so its effect is unknown) keeps its
key, and the participant answers with what it already did: nothing happens twice.

Waits follow the same idea (``saga/core/wait_rules.py``). The wait a redrive interrupts
begins again under its own number (``StepState.rewait``), so the resume token sent for it
and an event registered for it still resume the saga; a wait that had ended ends at once
with what it received, as a command that succeeded is answered from its first result.

These functions are pure; the decider applies them, and the admin client asks them first
so that a refused redrive is reported before anything is sent.
"""

from __future__ import annotations

from typing import Any

from saga.core.model import SagaState, StepState
from saga.core.states import SagaStatus
from saga.definition.saga import Saga

REDRIVABLE = frozenset({SagaStatus.RUNNING, SagaStatus.SUSPENDED, SagaStatus.DEAD_LETTERED})
_NO_EFFECT = frozenset({"transient", "permanent"})


def redrive_refusal(definition: Saga[Any], state: SagaState, step_name: str) -> str:  # noqa: PLR0911 - one refusal each
    """Why ``state`` cannot be redriven from ``step_name`` (empty: it can)."""
    names = [s.name for s in definition.steps]
    if step_name not in names:
        return f"no step {step_name!r} in {definition.key} (steps: {', '.join(names)})"
    if state.status not in REDRIVABLE:
        hint = "; an ended saga is not reopened: start a new one" if state.status.terminal else ""
        return (
            f"redrive applies to running, suspended or dead-lettered sagas; this one is {state.status}{hint}"
        )
    if state.cancel is not None:
        return "cancel was requested: the saga is being cancelled"
    undone = [name for name, s in state.steps.items() if s.count("undo")]
    if undone:
        return f"compensation has begun (steps {', '.join(undone)}): retry or force-complete it instead"
    index = names.index(step_name)
    started = [
        s.name
        for s in definition.steps[index:]
        if s.is_group and s.name in state.steps and state.steps[s.name].group is not None
    ]
    if started:
        return f"group steps {', '.join(started)} have started branches: retry or force-complete them instead"
    if index > state.cursor:
        current = names[state.cursor] if state.cursor < len(names) else "the end"
        return f"step {step_name!r} has not been reached yet (the saga is at {current})"
    return ""


def fresh_generation(step: StepState) -> bool:
    """Whether a re-run step gets a new idempotency key: all its attempts failed by reply."""
    attempts = [a for a in step.attempts if a.kind == "do"]
    return bool(attempts) and all(a.outcome in _NO_EFFECT for a in attempts)
