"""The decider: (definition, state, event) -> (new state, effects). Pure.

Nothing here touches Redis, a clock or the network: time comes in on the event, ids are
derived from the saga id, and retry jitter is a hash. The orchestrator, the in-process test
runner and replay all call :func:`decide` (and :func:`start`), so what a test proves and
what replay checks is what production runs.

A stale, duplicate or out-of-order event changes nothing: the decision says why it was
ignored and the history records it. Every status change goes through the lifecycle tables
(``saga/core/states.py``), so an illegal transition raises instead of being applied. Waiting
steps (sleep, signal, event) and the deadline follow the rules in ``saga/core/wait_rules.py``.

A :class:`~saga.core.tokens.Signer` may be passed in so that builders can put resume tokens in
their commands (``ctx.resume_token``): tokens are a pure function of the context's key and
the wait, so replay with the same key decides the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from redsaga.ids import derived_id, message_type
from saga.core.child_messages import CHILD, StartChild, child_saga_id
from saga.core.group_rules import GroupRules, completed_output
from saga.core.model import (
    NULL,
    Attempt,
    CancelRequested,
    CancelTimer,
    Dispatch,
    Effect,
    Event,
    EventReceived,
    ForceCompleted,
    Kind,
    Note,
    OperatorEvent,
    Outcome,
    ParentLink,
    RedriveRequested,
    RetryRequested,
    SagaState,
    SignalReceived,
    Started,
    StartTimer,
    StepReplied,
    StepState,
    TimerFired,
)
from saga.core.redrive import fresh_generation, redrive_refusal
from saga.core.states import SagaStatus, StepStatus, move_saga, move_step
from saga.core.tcc_rules import TccRules
from saga.core.tokens import Signer
from saga.core.wait_rules import WaitRules
from saga.definition.retry import Retry
from saga.definition.saga import LOCAL, Command, Compensation, Saga, Step, StepContext, invoke
from saga.errors import DefinitionError


class LocalCall(msgspec.Struct, gc=False, tag=True, kw_only=True, omit_defaults=True):
    """The input of a local action attempt: the saga's data and the outputs so far.

    ``waits`` gives the wait number of each signal step, and ``incarnation`` and ``at_ms``
    the saga's creation time and the decision's, so the action's ``ctx.resume_token`` can be
    made by the worker as the decider would (the token itself is never recorded).
    """

    data: msgspec.Raw
    outputs: dict[str, msgspec.Raw]
    waits: dict[str, int] = msgspec.field(default_factory=dict)
    incarnation: int = 0
    at_ms: int = 0


@dataclass(slots=True)
class Decision:
    """The result of deciding one event.

    ``touched`` names the branch records the decision may have changed (it copied them), so
    a commit writes those and looks at no other branch.
    """

    state: SagaState
    effects: list[Effect] = field(default_factory=list)
    ignored: str = ""
    touched: frozenset[str] = frozenset()

    @property
    def changed(self) -> bool:
        """Whether the state must be written (an ignored event is only recorded)."""
        return not self.ignored


_json = msgspec.json.Encoder()


def start(
    definition: Saga[Any],
    saga_id: str,
    data: bytes,
    partition: int,
    event: Started,
    *,
    signer: Signer | None = None,
) -> Decision:
    """Decide a new saga: record its data, start its deadline and begin the first step."""
    if event.saga and event.saga != definition.key:
        raise DefinitionError(f"saga {saga_id} started on {event.saga}, not {definition.key}")
    names = [s.name for s in definition.steps]
    if event.steps and event.steps != names[: len(event.steps)]:
        raise DefinitionError(
            f"saga {saga_id} started with steps {event.steps}; {definition.key} has {names}"
        )
    state = SagaState(
        id=saga_id,
        name=definition.name,
        version=definition.version,
        context=definition.context.name,
        partition=partition,
        status=SagaStatus.RUNNING,
        data=msgspec.Raw(data),
        steps={name: StepState() for name in event.steps or names},
        created_ms=event.at_ms,
        updated_ms=event.at_ms,
        parent=event.parent,
    )
    run = _Run(definition, state, event.at_ms, signer, started=True)
    run.advance()
    return run.decision()


def decide(
    definition: Saga[Any], state: SagaState, event: Event, *, signer: Signer | None = None
) -> Decision:
    """Decide ``event`` for a saga in ``state``; ``state`` itself is not modified."""
    if (definition.name, definition.version) != (state.name, state.version):
        raise DefinitionError(f"saga {state.id} runs {state.name}@{state.version}, not {definition.key}")
    run = _Run(definition, state.working_copy(), event.at_ms, signer)
    if isinstance(event, OperatorEvent) and event.expected_revision not in (0, state.revision):
        return Decision(
            state,
            [],
            f"the saga moved on: the request was made at revision {event.expected_revision}, "
            f"the saga is at revision {state.revision} ({state.status}); inspect it and decide again",
        )
    match event:
        case StepReplied():
            run.on_reply(event)
        case TimerFired():
            run.on_timer(event)
        case CancelRequested():
            run.on_cancel(event)
        case RetryRequested():
            run.on_retry(event)
        case ForceCompleted():
            run.on_force(event)
        case RedriveRequested():
            run.on_redrive(event)
        case SignalReceived():
            run.on_signal(event)
        case EventReceived():
            run.on_event(event)
        case Started():
            run.ignore("the saga has already started")
    if run.ignored:  # nothing changes: hand back the input, not a half-edited working copy
        return Decision(state, [], run.ignored)
    return run.decision()


class _Run(WaitRules, GroupRules, TccRules):
    """One decision in progress (a mutable working copy of the state)."""

    def __init__(
        self,
        definition: Saga[Any],
        state: SagaState,
        now_ms: int,
        signer: Signer | None,
        *,
        started: bool = False,
    ) -> None:
        self.definition = definition
        self.state = state
        self.now_ms = now_ms
        self.signer = signer
        self.effects: list[Effect] = []
        self.ignored = ""
        self.started = started
        self.was_terminal = state.status.terminal
        self._owned = set()
        self._bound = {}

    def decision(self) -> Decision:
        if not self.ignored:
            self.state.updated_ms = max(self.state.updated_ms, self.now_ms)
            self.deadline_effects(started=self.started, was_terminal=self.was_terminal)
            if self.state.status.terminal:
                self.state.signals.clear()
                if self.state.parent is not None and not self.was_terminal:
                    self.notify_parent()
        return Decision(self.state, self.effects, self.ignored, frozenset(self._owned))

    def ignore(self, reason: str) -> None:
        self.ignored = reason

    # -- events ----------------------------------------------------------------------------

    def on_reply(self, event: StepReplied) -> None:
        step_state = self.record(event.step)
        if step_state is None:
            what = "branch that has not started" if "#" in event.step else "step"
            self.ignore(f"no {what} {event.step!r} in {self.definition.key}")
            return
        attempt = step_state.current(event.kind)
        if attempt is None or attempt.command_id != event.command_id:
            current = f"attempt {attempt.n}" if attempt else "no attempt"
            self.ignore(
                f"late reply to {event.step}/{event.kind} attempt {event.attempt}; current is {current}"
            )
            return
        if attempt.outcome is not None:
            what = "late" if attempt.outcome == "timeout" else "duplicate"
            self.ignore(
                f"{what} reply to {event.step}/{event.kind} attempt {event.attempt} ({attempt.outcome})"
            )
            return
        step = self.bound(event.step)
        if step.waits:
            self.ignore(f"step {event.step!r} waits; nobody replies to it")
            return
        attempt.ended_ms = event.at_ms
        attempt.worker = event.worker or None
        self._cancel_timer(step_state)
        if event.ok:
            attempt.outcome = "ok"
            attempt.output = event.output
            if event.kind == "do":
                self._succeeded(step, step_state, event.output)
            elif event.kind == "confirm":
                step_state.status = move_step(step_state.status, StepStatus.CONFIRMED)
                self.advance()
            else:
                step_state.status = move_step(step_state.status, StepStatus.COMPENSATED)
                self._after_undo(step)
            return
        error = event.error or "failed without an error message"
        policy = self._policy(step, event.kind)
        permanent = event.permanent or (event.error_type or "") in policy.non_retryable
        self._failed(step, step_state, attempt, error, "permanent" if permanent else "transient")

    def on_timer(self, event: TimerFired) -> None:  # noqa: PLR0911 - one return per kind of timer
        if event.purpose == "deadline":
            self.on_deadline(event)
            return
        step_state = self.record(event.step)
        if step_state is None or step_state.timer != event.timer_id:
            self.ignore(f"stale timer {event.timer_id}")
            return
        step_state.timer = None
        step = self.bound(event.step)
        attempt = step_state.current(event.kind)
        if attempt is None or attempt.n != event.attempt:
            self.ignore(f"timer {event.timer_id} is for an attempt that is no longer current")
            return
        if step.waits:
            self.on_wait_timer(step, step_state, attempt)
            return
        if event.purpose == "expiry":
            if self.state.status.terminal or step_state.status != StepStatus.SUCCEEDED:
                self.ignore(f"expiry of {event.step} after its reservation was settled")
                return
            self.on_expiry(step)
            return
        if event.purpose == "retry":
            cancelling = self.stopping or self.branch_cancelling(step)
            if cancelling and event.kind == "do" and attempt.outcome != "timeout":
                step_state.status = move_step(step_state.status, StepStatus.FAILED)
                if step.within:
                    self.branch_failed(step, exhausted=False, unknown=False)
                else:
                    self._begin_compensation()
                return
            # After a timeout the step may have taken effect: even when cancelling, try again,
            # so the participant's dedupe answers with the recorded result (then it is undone).
            self._dispatch(step, event.kind)
            return
        attempt.ended_ms = event.at_ms
        timeout = self._timeout(step, event.kind)
        self._failed(step, step_state, attempt, f"no reply within {timeout:g}s", "timeout")

    def on_cancel(self, event: CancelRequested) -> None:
        status = self.state.status
        if status.terminal:
            self.ignore(f"the saga has already ended ({status})")
            return
        if self.state.cancel is not None:
            self.ignore("cancel was already requested")
            return
        if self.confirming():
            self.ignore("the saga is confirming its reservations (TCC): too late to cancel")
            return
        self.state.cancel = Note(at_ms=event.at_ms, what="cancel requested", by=event.by, reason=event.reason)
        self.stop()

    def stop(self) -> None:
        """After a cancel or the deadline: undo what completed, as soon as it is safe."""
        status = self.state.status
        if status == SagaStatus.COMPENSATING:
            return  # already undoing; it ends as compensated, the failure came first
        if status == SagaStatus.DEAD_LETTERED:
            failed_undo = self._failed_compensation()
            if failed_undo is not None:
                self.state.status = move_saga(status, SagaStatus.COMPENSATING)
                self._dispatch(failed_undo, "undo")
            elif self.state.cancel is not None or not self._outcome_unknown():
                self._begin_compensation()
            # else: the deadline passed on a step whose outcome is unknown; an operator decides
            return
        current = self._current_forward()
        if current is None:
            return
        step, step_state = current
        if step.is_group:
            if step_state.status == StepStatus.DISPATCHED:
                self.stop_group(step)
            return
        last = step_state.current("do")
        if step.child is not None and step_state.status == StepStatus.DISPATCHED and last is not None:
            reason = "cancel requested" if self.state.cancel is not None else "deadline exceeded"
            self.cancel_child(step, last.n, reason)
            return  # the child's end (cancelled, or completed first) decides, then compensation
        if step_state.status == StepStatus.WAITING and last is not None:
            reason = "cancel requested" if self.state.cancel is not None else "deadline exceeded"
            self.wait_failed(step, step_state, last, "cancelled", reason, note=False)
            return
        if step_state.status == StepStatus.RETRYING and not (last and last.outcome == "timeout"):
            self._cancel_timer(step_state)
            step_state.status = move_step(step_state.status, StepStatus.FAILED)
            self._begin_compensation()
        # DISPATCHED, or retrying after a timeout: the step may take (or have taken) effect;
        # its outcome decides, then the compensation runs.

    def _outcome_unknown(self) -> bool:
        current = self._current_forward()
        if current is not None and current[0].is_group:
            return self.group_outcome_unknown(current[0])
        last = current[1].current("do") if current is not None else None
        return last is not None and last.outcome == "timeout"

    def on_retry(self, event: RetryRequested) -> None:
        if self.state.status != SagaStatus.DEAD_LETTERED:
            self.ignore(f"retry applies to dead-lettered sagas, this one is {self.state.status}")
            return
        self._operator_note("operator retry", event)
        failed_undo = self._failed_compensation()
        if failed_undo is not None:
            cleanup = self._loser_cleanup(failed_undo)
            target = SagaStatus.RUNNING if cleanup else SagaStatus.COMPENSATING
            self.state.status = move_saga(self.state.status, target)
            self._dispatch(failed_undo, "undo")
            return
        failed_confirm = self.failed_confirmation()
        if failed_confirm is not None:
            self.state.status = move_saga(self.state.status, SagaStatus.RUNNING)
            self._dispatch(failed_confirm, "confirm")
            return
        current = self._current_forward()
        if current is None:
            self.ignore("no failed step to retry")
            return
        self.state.status = move_saga(self.state.status, SagaStatus.RUNNING)
        if current[0].is_group and current[1].group is not None:
            if not self.retry_group(current[0]):
                self.ignore("no branch of the group ran out of attempts")
            return
        self._begin_step(current[0])

    def on_force(self, event: ForceCompleted) -> None:  # noqa: PLR0911, PLR0912 - one case per stuck thing
        step_state = self.record(event.step)
        if step_state is None:
            self.ignore(f"no step {event.step!r}")
            return
        if self.state.status.terminal:
            self.ignore(f"the saga has already ended ({self.state.status})")
            return
        step = self.bound(event.step)
        self._operator_note("operator force-complete", event, step=event.step)
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
            cleanup = self._loser_cleanup(step)
            target = SagaStatus.RUNNING if cleanup else SagaStatus.COMPENSATING
            self.state.status = move_saga(self.state.status, target)
            self._after_undo(step)
            return
        if step_state.status == StepStatus.CONFIRM_FAILED:
            forced.kind = "confirm"
            step_state.attempts.append(forced)
            step_state.status = move_step(step_state.status, StepStatus.CONFIRMED)
            self.state.status = move_saga(self.state.status, SagaStatus.RUNNING)
            self.advance()
            return
        if step.is_group:
            self.ignore(
                f"force-complete a branch of group {step.name!r} ({step.name}#<index>), not the group"
            )
            return
        if self.state.status == SagaStatus.COMPENSATING:
            # The forward path is over; forcing its failed step now would send the next step
            # in the middle of the compensation.
            self.ignore("the saga is compensating; only a failed compensation can be force-completed")
            return
        current = self._current_forward()
        if current is None or current[0].name != (step.within or event.step):
            self.ignore(f"step {event.step!r} is not the step the saga is stuck on")
            return
        if step.within and step_state.status not in (
            StepStatus.FAILED,
            StepStatus.DISPATCHED,
            StepStatus.RETRYING,
        ):
            self.ignore(f"branch {event.step!r} is {step_state.status}: nothing to force")
            return
        self._cancel_timer(step_state)
        for attempt in step_state.attempts:
            if attempt.outcome is None:
                attempt.outcome, attempt.ended_ms = "cancelled", event.at_ms
        if self.state.wait is not None:
            self.release_wait(step_state)
        was_failed = step_state.status == StepStatus.FAILED
        if step_state.status in (StepStatus.DISPATCHED, StepStatus.RETRYING):
            step_state.status = move_step(step_state.status, StepStatus.FAILED)
        step_state.attempts.append(forced)
        if self.state.status in (SagaStatus.DEAD_LETTERED, SagaStatus.SUSPENDED):
            self.state.status = move_saga(self.state.status, SagaStatus.RUNNING)
        if step.within:
            self.force_branch(step, step_state, event.output, was_failed=was_failed)
            return
        self._succeeded(step, step_state, event.output)

    def on_redrive(self, event: RedriveRequested) -> None:
        refusal = redrive_refusal(self.definition, self.state, event.step)
        if refusal:
            self.ignore(refusal)
            return
        start = self.definition.step_named(event.step)
        self._operator_note("operator redrive", event, step=start.name)
        for step in self.definition.steps[start.index :]:
            step_state = self.state.steps[step.name]
            if step_state.status == StepStatus.PENDING:
                continue
            if step_state.status == StepStatus.WAITING and self.state.wait is not None:
                step_state.rewait = self.state.wait.n  # the wait begins again as itself: next_wait
                self.release_wait(step_state)
            self._cancel_timer(step_state)
            for attempt in step_state.attempts:
                if attempt.outcome is None:
                    attempt.outcome, attempt.ended_ms = "cancelled", event.at_ms
            if fresh_generation(step_state):
                step_state.generation += 1
            step_state.status = move_step(step_state.status, StepStatus.PENDING)
            step_state.output = msgspec.Raw(b"null")
        self.state.completed = [
            name for name in self.state.completed if self.definition.step_named(name).index < start.index
        ]
        self.state.cursor = start.index
        self.state.status = move_saga(self.state.status, SagaStatus.RUNNING)
        self.advance()

    def _operator_note(
        self, what: str, event: RetryRequested | ForceCompleted | RedriveRequested, *, step: str = ""
    ) -> None:
        """An operator moved the saga on: their note replaces the last error as ``state.error``.

        The error that stopped the saga stays where it happened (its attempt and the history);
        the saga's note says why it moves again, as after every retry, force-complete and
        redrive.
        """
        self.state.error = Note(at_ms=event.at_ms, what=what, by=event.by, reason=event.reason, step=step)

    # -- the forward path ------------------------------------------------------------------

    def advance(self) -> None:
        """Begin the next step, or complete the saga after the last one.

        A saga runs the steps it started with (its ``steps`` record): a step appended to its
        definition version later is past its end, so it completes without it (the safe
        change of ``saga/versions/compatibility.py``; replay of its history stays exact). After the last
        step, its TCC steps are confirmed (``saga/core/tcc_rules.py``) before it completes.
        """
        current = self._current_forward()
        if current is None and self.confirming():
            if not self.continue_confirmations():
                self.state.status = move_saga(self.state.status, SagaStatus.COMPLETED)
            return
        if self.stopping:
            self._begin_compensation()
            return
        if current is None:
            if not self.continue_confirmations():
                self.state.status = move_saga(self.state.status, SagaStatus.COMPLETED)
            return
        step, step_state = current
        step_state.status = move_step(step_state.status, StepStatus.SCHEDULED)
        self._begin_step(step)

    def _begin_step(self, step: Step[Any, Any]) -> None:
        if step.waits:
            self.begin_wait(step)
        elif step.is_group:
            self.begin_group(step)
        else:
            self._dispatch(step, "do")

    def _succeeded(self, step: Step[Any, Any], step_state: StepState, output: msgspec.Raw) -> None:
        if step.within:
            self.branch_succeeded(step, step_state, output)
            return
        step_state.status = move_step(step_state.status, StepStatus.SUCCEEDED)
        step_state.output = output
        self.state.completed.append(step.name)
        self.state.cursor = step.index + 1
        if step.tcc is not None:
            self.start_expiry(step, step_state)
        self.advance()

    def _failed(
        self, step: Step[Any, Any], step_state: StepState, attempt: Attempt, error: str, outcome: Outcome
    ) -> None:
        attempt.outcome = outcome
        attempt.error = error
        kind = attempt.kind
        policy = self._policy(step, kind)
        self.state.error = Note(
            at_ms=self.now_ms, what=f"{kind} attempt {attempt.n} {outcome}", step=step.name, reason=error
        )
        # A timed-out attempt may have taken effect: its outcome is unknown, so it is retried
        # even when cancelling (the retry learns the outcome from the participant's dedupe) and,
        # when attempts run out, the saga is parked for an operator, never compensated blind.
        # A branch of a closed group is cancelling too (its group gave up on it).
        unknown = outcome == "timeout"
        stopping = self.stopping or self.branch_cancelling(step)
        cancelling = stopping and kind == "do" and not unknown
        if outcome != "permanent" and attempt.n < policy.attempts and not cancelling:
            target = {
                "do": StepStatus.RETRYING,
                "undo": StepStatus.COMPENSATION_RETRYING,
                "confirm": StepStatus.CONFIRM_RETRYING,
            }[kind]
            step_state.status = move_step(step_state.status, target)
            timer_id = f"{self.state.id}:{step.name}:{kind}:{attempt.n}:retry"
            step_state.timer = timer_id
            delay = policy.delay_ms(attempt.n, f"{self.state.id}:{step.name}:{kind}")
            self.effects.append(
                StartTimer(
                    timer_id=timer_id,
                    delay_ms=delay,
                    purpose="retry",
                    step=step.name,
                    kind=kind,
                    attempt=attempt.n,
                )
            )
            return
        if kind == "undo":
            step_state.status = move_step(step_state.status, StepStatus.COMPENSATION_FAILED)
            self.state.status = move_saga(self.state.status, SagaStatus.DEAD_LETTERED)
            return
        if kind == "confirm":  # a reservation that cannot be confirmed: an operator decides
            step_state.status = move_step(step_state.status, StepStatus.CONFIRM_FAILED)
            self.state.status = move_saga(self.state.status, SagaStatus.DEAD_LETTERED)
            return
        step_state.status = move_step(step_state.status, StepStatus.FAILED)
        compensate = outcome == "permanent" or cancelling or policy.on_exhausted == "compensate"
        if step.within:
            self.branch_failed(step, exhausted=not compensate, unknown=unknown)
        elif not unknown and compensate:
            self._begin_compensation()
        else:
            self.state.status = move_saga(self.state.status, SagaStatus.DEAD_LETTERED)

    # -- compensation ----------------------------------------------------------------------

    def _undo_order(self) -> list[str]:
        """Steps to look at for undoing, latest completion first.

        A group the saga stopped in (failed, or closed by a cancel) completed branches after
        every completed step, so it comes first.
        """
        order = list(reversed(self.state.completed))
        current = self._current_forward()
        if current is not None and current[0].is_group and current[1].group is not None:
            order.insert(0, current[0].name)
        return order

    def _begin_compensation(self) -> None:
        if not any(self._undo_pending(name) for name in self._undo_order()):
            end = SagaStatus.CANCELLED if self.state.cancel is not None else SagaStatus.FAILED
            self.state.status = move_saga(self.state.status, end)
            return
        self.state.status = move_saga(self.state.status, SagaStatus.COMPENSATING)
        self._continue_compensation()

    def _undo_pending(self, name: str) -> bool:
        step = self.definition.step_named(name)
        if step.is_group:
            return self.next_undo(name) is not None or self.undoing(name)
        return step.compensation is not None and self.state.steps[name].status == StepStatus.SUCCEEDED

    def _continue_compensation(self) -> None:
        """Undo the latest completed step (or branch) not yet undone; end when none is left."""
        for name in self._undo_order():
            step = self.definition.step_named(name)
            step_state = self.state.steps[name]
            if step.is_group:
                if self.undoing(name):
                    return  # a first-of-N loser's undo is in flight: its outcome first
                key = self.next_undo(name)
                if key is not None:
                    if step_state.status == StepStatus.SUCCEEDED:
                        step_state.status = move_step(step_state.status, StepStatus.COMPENSATING)
                    self._dispatch(self.bound(key), "undo")
                    return
                if step_state.status == StepStatus.COMPENSATING:
                    step_state.status = move_step(step_state.status, StepStatus.COMPENSATED)
                continue
            if step.compensation is not None and step_state.status == StepStatus.SUCCEEDED:
                self._dispatch(step, "undo")
                return
        end = SagaStatus.CANCELLED if self.state.cancel is not None else SagaStatus.COMPENSATED
        self.state.status = move_saga(self.state.status, end)

    def _after_undo(self, step: Step[Any, Any]) -> None:
        """An undo succeeded: go on compensating, or settle the group of a first-of-N loser.

        A loser's undo runs on the forward path; when it ends, its group settles: the
        clean-up goes on, or -- after a cancel that waited for this undo -- the
        compensation begins.
        """
        if step.within and self.state.status != SagaStatus.COMPENSATING:
            self.settle_group(self.definition.step_named(step.within))
            return
        self._continue_compensation()

    def _loser_cleanup(self, step: Step[Any, Any]) -> bool:
        """Whether undoing ``step`` is a first-of-N clean-up on the forward path."""
        if not step.within or self.state.status == SagaStatus.COMPENSATING:
            return False
        group = self.state.steps[step.within].group
        return group is not None and group.closed == "won" and not self.stopping

    # -- dispatching -----------------------------------------------------------------------

    def _dispatch(self, step: Step[Any, Any], kind: Kind) -> None:
        step_state = self.record(step.name)
        assert step_state is not None  # noqa: S101 - only started steps and branches are sent
        self._cancel_timer(step_state)  # a TCC step's expiry timer, once it is confirmed or undone
        n = step_state.count(kind) + 1
        command_id = derived_id(self.state.id, f"{step.name}:{kind}:{n}")
        target_status = {
            "do": StepStatus.DISPATCHED,
            "undo": StepStatus.COMPENSATING,
            "confirm": StepStatus.CONFIRMING,
        }[kind]
        step_state.status = move_step(step_state.status, target_status)
        try:
            participant, type_name, payload = self._build(step, kind, n, command_id)
        except Exception as error:  # noqa: BLE001 - a builder bug fails the step, not the worker
            attempt = Attempt(
                n=n,
                kind=kind,
                command_id=command_id,
                participant="?",
                input_type="?",
                input=msgspec.Raw(b"null"),
                dispatched_ms=self.now_ms,
                ended_ms=self.now_ms,
            )
            step_state.attempts.append(attempt)
            self._failed(
                step, step_state, attempt, f"builder raised {type(error).__name__}: {error}", "permanent"
            )
            return
        step_state.attempts.append(
            Attempt(
                n=n,
                kind=kind,
                command_id=command_id,
                participant=participant,
                input_type=type_name,
                input=msgspec.Raw(payload),
                dispatched_ms=self.now_ms,
            )
        )
        timeout = self._timeout(step, kind)
        self.effects.append(
            Dispatch(
                step=step.name,
                kind=kind,
                attempt=n,
                participant=participant,
                command_id=command_id,
                message_type=type_name,
                payload=msgspec.Raw(payload),
                timeout_ms=int(timeout * 1000) if timeout else None,
            )
        )
        if timeout:
            timer_id = f"{self.state.id}:{step.name}:{kind}:{n}:timeout"
            step_state.timer = timer_id
            self.effects.append(
                StartTimer(
                    timer_id=timer_id,
                    delay_ms=int(timeout * 1000),
                    purpose="timeout",
                    step=step.name,
                    kind=kind,
                    attempt=n,
                )
            )

    def _build(self, step: Step[Any, Any], kind: Kind, n: int, command_id: str) -> tuple[str, str, bytes]:
        """Run the step's (or its compensation's) builder: (participant, message type, payload)."""
        target = self._target(step, kind)
        outputs = Outputs(self, step.name)
        if kind == "do" and step.child is not None:
            return self._build_child(step, n, command_id)
        if target.local:
            waits = {s.name: self.wait_number(s.name) for s in self.definition.steps if s.kind == "signal"}
            call = LocalCall(
                data=self.state.data,
                outputs={k: msgspec.Raw(v) for k, v in outputs.items()},
                waits=waits,
                incarnation=self.state.created_ms if waits else 0,
                at_ms=self.now_ms if waits else 0,
            )
            return LOCAL, message_type(LocalCall), _json.encode(call)
        context = StepContext(self.state.id, step.name, n, outputs, self.tokens())
        built = invoke(target, self.definition.decode_data(self.state.data), context)
        if not isinstance(built, Command):
            raise DefinitionError(
                f"{step.saga}.{step.name}: the builder returned {type(built).__name__}, not command(...)"
            )
        return built.participant, message_type(type(built.message)), _json.encode(built.message)

    def _build_child(self, step: Step[Any, Any], n: int, command_id: str) -> tuple[str, str, bytes]:
        """The command that starts a child saga, with the link it reports its end through."""
        spec = step.child
        assert spec is not None  # noqa: S101 - child steps only
        data = self.definition.decode_data(self.state.data)
        if spec.per_item:
            group = self.definition.step_named(step.within).group
            assert group is not None  # noqa: S101 - a map's child
            child_data = spec.data(data, group.items_of(data)[int(step.name.rpartition("#")[2])])
        else:
            child_data = spec.data(data)
        record = self.record(step.name)
        assert record is not None  # noqa: S101 - a started step
        message = StartChild(
            saga=spec.definition.key,
            saga_id=child_saga_id(self.state.id, step.name, record.generation),
            data=msgspec.Raw(spec.definition.encode_data(child_data)),
            parent=ParentLink(
                context=self.state.context,
                partition=self.state.partition,
                saga_id=self.state.id,
                saga=self.definition.key,
                step=step.name,
                attempt=n,
                command_id=command_id,
            ),
        )
        return CHILD, message_type(StartChild), _json.encode(message)

    def _target(self, step: Step[Any, Any], kind: Kind) -> Step[Any, Any] | Compensation:
        if kind == "do":
            return step
        target = step.compensation if kind == "undo" else step.confirmation
        assert target is not None  # noqa: S101 - undo (confirm) attempts exist only when declared
        return target

    # -- helpers ---------------------------------------------------------------------------

    def _policy(self, step: Step[Any, Any], kind: Kind) -> Retry:
        target = self._target(step, kind)
        return target.retry

    def _timeout(self, step: Step[Any, Any], kind: Kind) -> float | None:
        if kind == "do":
            return step.timeout_s
        return self._target(step, kind).timeout_s

    def _cancel_timer(self, step_state: StepState) -> None:
        if step_state.timer is not None:
            self.effects.append(CancelTimer(timer_id=step_state.timer))
            step_state.timer = None

    def _current_forward(self) -> tuple[Step[Any, Any], StepState] | None:
        """The step at the cursor, unless the saga is past the last step it has a record of."""
        if self.state.cursor >= len(self.definition.steps):
            return None
        step = self.definition.steps[self.state.cursor]
        step_state = self.state.steps.get(step.name)
        return None if step_state is None else (step, step_state)

    def _failed_compensation(self) -> Step[Any, Any] | None:
        for key, record in self.state.branches.items():
            if record.status == StepStatus.COMPENSATION_FAILED:
                return self.bound(key)
        for name in self.state.completed:
            if self.state.steps[name].status == StepStatus.COMPENSATION_FAILED:
                return self.definition.step_named(name)
        return None


class Outputs(Mapping[str, bytes]):
    """The outputs a builder can read (``StepContext.output``), computed when asked for.

    Completed steps by name; a completed ``parallel`` group's branches by their own names;
    a map's list of outputs (built from its branch records only if read); and, for a branch
    (in its builder or compensation), its own output under its key ``<group>#<index>``.
    """

    def __init__(self, run: _Run, current: str) -> None:
        self._run = run
        self._current = current

    def __getitem__(self, name: str) -> bytes:
        state, definition = self._run.state, self._run.definition
        own = "#" in self._current and (
            name == self._current
            or (
                definition.step_named(self._current).name == name and not definition.step_named(name).per_item
            )
        )
        if own:
            record = state.branches.get(self._current)
            if record is not None and record.output is not NULL:
                return bytes(record.output)
            raise KeyError(name)
        if name in state.completed:
            return completed_output(definition, state, name)
        for group_name in state.completed:
            spec = definition.step_named(group_name).group
            if spec is None or spec.dynamic:
                continue
            group = state.steps[group_name].group
            for branch in spec.branches:
                if branch.name != name:
                    continue
                if spec.mode == "first" and group is not None and group.winner != branch.position:
                    raise KeyError(name)
                return bytes(state.branches[f"{group_name}#{branch.position}"].output)
        raise KeyError(name)

    def _names(self) -> list[str]:
        state, definition = self._run.state, self._run.definition
        names = list(state.completed)
        for group_name in state.completed:
            spec = definition.step_named(group_name).group
            if spec is not None and not spec.dynamic:
                group = state.steps[group_name].group
                names += [
                    b.name
                    for b in spec.branches
                    if spec.mode == "all" or (group is not None and group.winner == b.position)
                ]
        if "#" in self._current and self._current in state.branches:
            names.append(self._current)
        return [n for n in names if n in self]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())
