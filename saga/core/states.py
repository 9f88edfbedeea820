"""The saga and step lifecycles: every state and every allowed transition, as data.

``saga graph`` and the docs' state tables are generated from these tables; the decider
moves a saga or a step only through :func:`move_saga` and :func:`move_step`, which raise
:class:`~saga.errors.IllegalTransition` for anything not listed here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from saga.errors import IllegalTransition


class SagaStatus(StrEnum):
    """Where a saga is in its lifecycle."""

    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    FAILED = "failed"
    COMPENSATED = "compensated"
    CANCELLED = "cancelled"
    DEAD_LETTERED = "dead_lettered"

    @property
    def terminal(self) -> bool:
        """Whether the saga has ended (nothing moves it any more)."""
        return self in TERMINAL


class StepStatus(StrEnum):
    """Where one step is: its forward lifecycle, then its compensation."""

    PENDING = "pending"
    SCHEDULED = "scheduled"
    DISPATCHED = "dispatched"
    WAITING = "waiting"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    COMPENSATING = "compensating"
    COMPENSATION_RETRYING = "compensation_retrying"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    CONFIRMING = "confirming"
    CONFIRM_RETRYING = "confirm_retrying"
    CONFIRMED = "confirmed"
    CONFIRM_FAILED = "confirm_failed"


REDRIVE: Final = "an operator redrove the saga from this step or an earlier one"

TERMINAL: Final = frozenset(
    {SagaStatus.COMPLETED, SagaStatus.FAILED, SagaStatus.COMPENSATED, SagaStatus.CANCELLED}
)
SETTLED: Final = TERMINAL | {SagaStatus.DEAD_LETTERED}
"""Where a saga stops moving by itself: its ends, and dead-lettered (where only an operator
moves it on). ``SagaClient.wait`` returns there; the transition that reaches one announces
it on the partition's ``ends`` stream (``saga/store/lua/transition.lua``)."""

SAGA_TRANSITIONS: Final[dict[SagaStatus, dict[SagaStatus, str]]] = {
    SagaStatus.RUNNING: {
        SagaStatus.SUSPENDED: "a step waits for a signal, a timer or an event",
        SagaStatus.COMPENSATING: "a step failed permanently, or cancel, after steps completed",
        SagaStatus.COMPLETED: "the last step succeeded",
        SagaStatus.FAILED: "a step failed permanently and nothing needed undoing",
        SagaStatus.CANCELLED: "cancel requested and nothing needed undoing",
        SagaStatus.DEAD_LETTERED: "a step ran out of retries",
    },
    SagaStatus.SUSPENDED: {
        SagaStatus.RUNNING: "the wait ended",
        SagaStatus.COMPENSATING: "cancel, deadline or a wait timed out, after steps completed",
        SagaStatus.CANCELLED: "cancel requested and nothing needed undoing",
        SagaStatus.FAILED: "deadline or a wait timed out, and nothing needed undoing",
    },
    SagaStatus.COMPENSATING: {
        SagaStatus.COMPENSATED: "every completed step was undone after a failure",
        SagaStatus.CANCELLED: "every completed step was undone after a cancel",
        SagaStatus.DEAD_LETTERED: "a compensation ran out of retries or failed permanently",
    },
    SagaStatus.DEAD_LETTERED: {
        SagaStatus.RUNNING: "an operator retried the step, force-completed it or redrove the saga",
        SagaStatus.COMPENSATING: "an operator retried the compensations, or cancelled",
        SagaStatus.CANCELLED: "an operator cancelled and nothing needed undoing",
        SagaStatus.COMPENSATED: "an operator force-completed the last compensation",
        SagaStatus.FAILED: "the deadline passed and nothing needed undoing",
    },
    SagaStatus.COMPLETED: {},
    SagaStatus.FAILED: {},
    SagaStatus.COMPENSATED: {},
    SagaStatus.CANCELLED: {},
}

STEP_TRANSITIONS: Final[dict[StepStatus, dict[StepStatus, str]]] = {
    StepStatus.PENDING: {
        StepStatus.SCHEDULED: "the saga reached the step",
    },
    StepStatus.SCHEDULED: {
        StepStatus.DISPATCHED: "its command was sent (compensation registered first)",
        StepStatus.WAITING: "it waits: a sleep, a signal or another context's event",
        StepStatus.FAILED: "the saga was cancelled before dispatch",
    },
    StepStatus.DISPATCHED: {
        StepStatus.SUCCEEDED: "the participant replied with its output",
        StepStatus.RETRYING: "a transient failure or a timeout, attempts left",
        StepStatus.FAILED: "a permanent failure, or no attempts left",
        StepStatus.PENDING: REDRIVE,
    },
    StepStatus.WAITING: {
        StepStatus.SUCCEEDED: "the wait ended: the timer fired, the signal or the event came",
        StepStatus.FAILED: "the wait timed out, or the saga was cancelled or ran past its deadline",
        StepStatus.PENDING: REDRIVE,
    },
    StepStatus.RETRYING: {
        StepStatus.DISPATCHED: "the back-off elapsed: the next attempt was sent",
        StepStatus.FAILED: "the saga was cancelled while waiting to retry",
        StepStatus.PENDING: REDRIVE,
    },
    StepStatus.FAILED: {
        StepStatus.DISPATCHED: "an operator retried the step",
        StepStatus.SUCCEEDED: "an operator force-completed the step",
        StepStatus.PENDING: REDRIVE,
    },
    StepStatus.SUCCEEDED: {
        StepStatus.COMPENSATING: "its compensation was sent",
        StepStatus.CONFIRMING: "the saga succeeded: the TCC step's confirmation was sent",
        StepStatus.COMPENSATED: "it has no compensation: nothing to undo",
        StepStatus.PENDING: REDRIVE,
    },
    StepStatus.COMPENSATING: {
        StepStatus.COMPENSATED: "the compensation succeeded",
        StepStatus.COMPENSATION_RETRYING: "the compensation failed transiently, attempts left",
        StepStatus.COMPENSATION_FAILED: "the compensation failed permanently or ran out of attempts",
    },
    StepStatus.COMPENSATION_RETRYING: {
        StepStatus.COMPENSATING: "the back-off elapsed: the next attempt was sent",
    },
    StepStatus.COMPENSATION_FAILED: {
        StepStatus.COMPENSATING: "an operator retried the compensation",
        StepStatus.COMPENSATED: "an operator force-completed the compensation",
    },
    StepStatus.COMPENSATED: {},
    StepStatus.CONFIRMING: {
        StepStatus.CONFIRMED: "the confirmation succeeded: the reservation is final",
        StepStatus.CONFIRM_RETRYING: "the confirmation failed transiently, attempts left",
        StepStatus.CONFIRM_FAILED: "the confirmation failed permanently or ran out of attempts",
    },
    StepStatus.CONFIRM_RETRYING: {
        StepStatus.CONFIRMING: "the back-off elapsed: the next attempt was sent",
    },
    StepStatus.CONFIRM_FAILED: {
        StepStatus.CONFIRMING: "an operator retried the confirmation",
        StepStatus.CONFIRMED: "an operator force-completed the confirmation",
    },
    StepStatus.CONFIRMED: {},
}


def move_saga(current: SagaStatus, target: SagaStatus) -> SagaStatus:
    """Return ``target`` if the saga lifecycle allows ``current -> target``, else raise."""
    if current != target and target not in SAGA_TRANSITIONS[current]:
        raise IllegalTransition("saga", current, target)
    return target


def move_step(current: StepStatus, target: StepStatus) -> StepStatus:
    """Return ``target`` if the step lifecycle allows ``current -> target``, else raise."""
    if current != target and target not in STEP_TRANSITIONS[current]:
        raise IllegalTransition("step", current, target)
    return target
