"""The decider: (definition, state, event) -> (new state, effects). Pure.

Nothing here touches Redis, a clock or the network: time comes in on the event, ids are
derived from the saga id, and retry jitter is a hash. The orchestrator, the in-process test
runner and replay all call :func:`decide` (and :func:`start`), so what a test proves and
what replay checks is what production runs.

A stale, duplicate or out-of-order event changes nothing: the decision says why it was
ignored and the history records it. Every status change goes through the lifecycle tables
(``saga/core/states.py``), so an illegal transition raises instead of being applied.

The decision in progress owns the forward path -- a step's replies and timers, retries,
cancel and stop -- and composes one rule object per kind of step or event: waits and the
deadline, groups, TCC, compensation, operator actions and the commands it sends, each in
its own ``saga/core/*_rules.py`` (or ``commands.py``) and each seeing the decision only
through :class:`~saga.core.rules.Run`.

A :class:`~saga.core.tokens.Signer` may be passed in so that builders can put resume tokens in
their commands (``ctx.resume_token``): tokens are a pure function of the context's key and
the wait, so replay with the same key decides the same.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from saga.core.commands import Commands
from saga.core.compensation_rules import CompensationRules
from saga.core.decision import Decision
from saga.core.effects import CancelTimer, Effect, StartTimer
from saga.core.group_rules import GroupRules, renamed
from saga.core.model import (
    Attempt,
    CancelRequested,
    Event,
    EventReceived,
    ForceCompleted,
    Kind,
    Note,
    OperatorEvent,
    Outcome,
    RedriveRequested,
    RetryRequested,
    SagaState,
    SignalReceived,
    Started,
    StepReplied,
    StepState,
    TimerFired,
)
from saga.core.operator_rules import OperatorRules
from saga.core.rate_rules import held
from saga.core.states import SagaStatus, StepStatus, move_saga, move_step
from saga.core.tcc_rules import TccRules
from saga.core.timer_ids import attempt_timer_id
from saga.core.tokens import Signer
from saga.core.wait_rules import WaitRules
from saga.core.working import WorkingCopy
from saga.definition.saga import Saga, Step
from saga.errors import DefinitionError

__all__ = ["Decision", "decide", "start"]  # Decision lives in saga/core/decision.py


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
        raise DefinitionError(f"saga {saga_id} started on {event.saga}", saga=definition.name)
    names = [s.name for s in definition.steps]
    if event.steps and event.steps != names[: len(event.steps)]:
        raise DefinitionError(
            f"saga {saga_id} started with steps {event.steps}; {definition.key} has {names}",
            saga=definition.name,
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
        stamped=True,
    )
    run = _Run(definition, state, event.at_ms, signer, started=True)
    run.advance()
    return run.decision()


def decide(
    definition: Saga[Any], state: SagaState, event: Event, *, signer: Signer | None = None
) -> Decision:
    """Decide ``event`` for a saga in ``state``; ``state`` itself is not modified."""
    if (definition.name, definition.version) != (state.name, state.version):
        raise DefinitionError(
            f"saga {state.id} runs {state.name}@{state.version}, not {definition.key}", saga=definition.name
        )
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
            run.operator.on_retry(event)
        case ForceCompleted():
            run.operator.on_force(event)
        case RedriveRequested():
            run.operator.on_redrive(event)
        case SignalReceived():
            run.waits.on_signal(event)
        case EventReceived():
            run.waits.on_event(event)
        case Started():
            run.ignore("the saga has already started")
    if run.ignored:  # nothing changes: hand back the input, not a half-edited working copy
        return Decision(state, [], run.ignored)
    return run.decision()


class _Run(WorkingCopy):
    """One decision in progress (the :class:`~saga.core.rules.Run` its rule sets see).

    It owns the forward path and composes the rule sets; the working copy and its records,
    copied on write, are its :class:`~saga.core.working.WorkingCopy` part.
    """

    def __init__(
        self,
        definition: Saga[Any],
        state: SagaState,
        now_ms: int,
        signer: Signer | None,
        *,
        started: bool = False,
    ) -> None:
        WorkingCopy.__init__(self, state, started)  # not super(): 2k instructions less a decision
        self.definition = definition
        self.now_ms = now_ms
        self.effects: list[Effect] = []
        self.ignored = ""
        self.started = started
        self.was_terminal = state.status.terminal
        self._bound: dict[str, Step[Any, Any]] = {}
        self.waits = WaitRules(self, signer)
        self.commands = Commands(self, self.waits)

    # The rule sets most decisions never reach (a reply to a plain step meets only the two
    # above) are made when first used.

    @functools.cached_property
    def groups(self) -> GroupRules:
        """Group steps and their branches."""
        return GroupRules(self)

    @functools.cached_property
    def tcc(self) -> TccRules:
        """TCC steps and child sagas' end reports."""
        return TccRules(self)

    @functools.cached_property
    def undo(self) -> CompensationRules:
        """Compensation."""
        return CompensationRules(self, self.groups)

    @functools.cached_property
    def operator(self) -> OperatorRules:
        """Operator actions."""
        return OperatorRules(self, waits=self.waits, groups=self.groups, tcc=self.tcc, undo=self.undo)

    def decision(self) -> Decision:
        if not self.ignored:
            self.state.updated_ms = max(self.state.updated_ms, self.now_ms)
            self.waits.deadline_effects(started=self.started, was_terminal=self.was_terminal)
            if self.state.status.terminal:
                self.state.signals.clear()
                if self.state.parent is not None and not self.was_terminal:
                    self.tcc.notify_parent()
        return Decision(self.state, self.effects, self.ignored, self.touched)

    def ignore(self, reason: str) -> None:
        self.ignored = reason

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
        self.cancel_timer(step_state)
        if event.ok:
            attempt.outcome = "ok"
            attempt.output = event.output
            if event.kind == "do":
                self.succeeded(step, step_state, event.output)
            elif event.kind == "confirm":
                step_state.status = move_step(step_state.status, StepStatus.CONFIRMED)
                self.advance()
            else:
                step_state.status = move_step(step_state.status, StepStatus.COMPENSATED)
                self.undo.after_undo(step)
            return
        error = event.error or "failed without an error message"
        policy = self.commands.policy(step, event.kind)
        permanent = event.permanent or (event.error_type or "") in policy.non_retryable
        self.failed(step, step_state, attempt, error, "permanent" if permanent else "transient")

    def on_timer(self, event: TimerFired) -> None:  # noqa: PLR0911 - one return per kind of timer
        if event.purpose == "deadline":
            self.waits.on_deadline(event)
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
            self.waits.on_wait_timer(step, step_state, attempt)
            return
        if event.purpose == "expiry":
            if self.state.status.terminal or step_state.status != StepStatus.SUCCEEDED:
                self.ignore(f"expiry of {event.step} after its reservation was settled")
                return
            self.tcc.on_expiry(step)
            return
        if event.purpose in ("retry", "rate", "slot"):  # a back-off elapsed, a token is due, or a slot
            cancelling = self.stopping or self.groups.branch_cancelling(step)
            if cancelling and event.kind == "do" and attempt.outcome != "timeout":
                if event.purpose != "retry":  # never sent: it ends here, and uses no token or slot
                    attempt.outcome, attempt.ended_ms = "cancelled", event.at_ms
                step_state.status = move_step(step_state.status, StepStatus.FAILED)
                if step.within:
                    self.groups.branch_failed(step, exhausted=False, unknown=False)
                else:
                    self.begin_compensation()
                return
            # After a timeout the step may have taken effect: even when cancelling, try again,
            # so the participant's dedupe answers with the recorded result (then it is undone).
            if event.purpose != "retry":
                self.commands.send(step, step_state, attempt)
                return
            self.dispatch(step, event.kind)
            return
        attempt.ended_ms = event.at_ms
        timeout = self.commands.timeout(step, event.kind)
        self.failed(step, step_state, attempt, f"no reply within {timeout:g}s", "timeout")

    def on_cancel(self, event: CancelRequested) -> None:
        status = self.state.status
        if status.terminal:
            self.ignore(f"the saga has already ended ({status})")
            return
        if self.state.cancel is not None:
            self.ignore("cancel was already requested")
            return
        if self.tcc.confirming():
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
            failed_undo = self.undo.failed_compensation()
            if failed_undo is not None:
                self.state.status = move_saga(status, SagaStatus.COMPENSATING)
                self.dispatch(failed_undo, "undo")
            elif self.state.cancel is not None or not self.undo.outcome_unknown():
                self.begin_compensation()
            # else: the deadline passed on a step whose outcome is unknown; an operator decides
            return
        current = self.current_forward()
        if current is None:
            return
        step, step_state = current
        if step.is_group:
            if step_state.status == StepStatus.DISPATCHED:
                self.groups.stop_group(step)
            return
        last = step_state.current("do")
        if step.child is not None and step_state.status == StepStatus.DISPATCHED and last is not None:
            reason = "cancel requested" if self.state.cancel is not None else "deadline exceeded"
            self.groups.cancel_child(step, last.n, reason)
            return  # the child's end (cancelled, or completed first) decides, then compensation
        if step_state.status == StepStatus.WAITING and last is not None:
            reason = "cancel requested" if self.state.cancel is not None else "deadline exceeded"
            self.waits.wait_failed(step, step_state, last, "cancelled", reason, note=False)
            return
        saga_id = self.state.id  # waiting for a rate limit's token, or for a concurrency key's slot
        unsent = held(saga_id, step.name, step_state) or held(saga_id, step.name, step_state, "slot")
        if unsent or (step_state.status == StepStatus.RETRYING and not (last and last.outcome == "timeout")):
            if unsent:  # never sent: nothing to undo, and no token or slot used
                unsent.outcome, unsent.ended_ms = "cancelled", self.now_ms
            self.cancel_timer(step_state)
            step_state.status = move_step(step_state.status, StepStatus.FAILED)
            self.begin_compensation()
        # DISPATCHED, or retrying after a timeout: the step may take (or have taken) effect;
        # its outcome decides, then the compensation runs.

    def advance(self) -> None:
        """Begin the next step, or complete the saga after the last one.

        A saga runs the steps it started with (its ``steps`` record): a step appended to its
        definition version later is past its end, so it completes without it (the safe
        change of ``saga/versions/compatibility.py``; replay of its history stays exact). After the last
        step, its TCC steps are confirmed (``saga/core/tcc_rules.py``) before it completes.
        """
        current = self.current_forward()
        if current is None and self.tcc.confirming():
            if not self.tcc.continue_confirmations():
                self.state.status = move_saga(self.state.status, SagaStatus.COMPLETED)
            return
        if self.stopping:
            self.begin_compensation()
            return
        if current is None:
            if not self.tcc.continue_confirmations():
                self.state.status = move_saga(self.state.status, SagaStatus.COMPLETED)
            return
        step, step_state = current
        step_state.status = move_step(step_state.status, StepStatus.SCHEDULED)
        self.begin_step(step)

    def begin_step(self, step: Step[Any, Any]) -> None:
        if step.waits:
            self.waits.begin_wait(step)
        elif step.is_group:
            self.groups.begin_group(step)
        else:
            self.dispatch(step, "do")

    def succeeded(self, step: Step[Any, Any], step_state: StepState, output: msgspec.Raw) -> None:
        if step.within:
            self.groups.branch_succeeded(step, step_state, output)
            return
        step_state.status = move_step(step_state.status, StepStatus.SUCCEEDED)
        step_state.output = output
        self.state.completed.append(step.name)
        self.state.cursor = step.index + 1
        if step.tcc is not None:
            self.tcc.start_expiry(step, step_state)
        self.advance()

    def failed(
        self, step: Step[Any, Any], step_state: StepState, attempt: Attempt, error: str, outcome: Outcome
    ) -> None:
        attempt.outcome = outcome
        attempt.error = error
        kind = attempt.kind
        policy = self.commands.policy(step, kind)
        self.state.error = Note(
            at_ms=self.now_ms, what=f"{kind} attempt {attempt.n} {outcome}", step=step.name, reason=error
        )
        # A timed-out attempt may have taken effect: its outcome is unknown, so it is retried
        # even when cancelling (the retry learns the outcome from the participant's dedupe) and,
        # when attempts run out, the saga is parked for an operator, never compensated blind.
        # A branch of a closed group is cancelling too (its group gave up on it).
        unknown = outcome == "timeout"
        stopping = self.stopping or self.groups.branch_cancelling(step)
        cancelling = stopping and kind == "do" and not unknown
        if outcome != "permanent" and attempt.n < policy.attempts and not cancelling:
            target = {
                "do": StepStatus.RETRYING,
                "undo": StepStatus.COMPENSATION_RETRYING,
                "confirm": StepStatus.CONFIRM_RETRYING,
            }[kind]
            step_state.status = move_step(step_state.status, target)
            timer_id = attempt_timer_id(self.state.id, step.name, kind, attempt.n, "retry")
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
            self.groups.branch_failed(step, exhausted=not compensate, unknown=unknown)
        elif not unknown and compensate:
            self.begin_compensation()
        else:
            self.state.status = move_saga(self.state.status, SagaStatus.DEAD_LETTERED)

    def cancel_timer(self, step_state: StepState) -> None:
        if step_state.timer is not None:
            self.effects.append(CancelTimer(timer_id=step_state.timer))
            step_state.timer = None

    def current_forward(self) -> tuple[Step[Any, Any], StepState] | None:
        """The step at the cursor, unless the saga is past the last step it has a record of."""
        if self.state.cursor >= len(self.definition.steps):
            return None
        step = self.definition.steps[self.state.cursor]
        step_state = self.record(step.name)
        return None if step_state is None else (step, step_state)

    # -- records ---------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """Whether the saga goes no further forward: cancel requested or deadline passed."""
        return self.state.cancel is not None or self.state.expired is not None

    def bound(self, key: str) -> Step[Any, Any]:
        """The step a record key runs; for a branch, its branch step renamed to the key."""
        if "#" not in key:
            return self.definition.step_named(key)
        step = self._bound.get(key)
        if step is None:
            step = self._bound[key] = renamed(self.definition.step_named(key), key)
        return step

    # -- what the rule sets own ------------------------------------------------------------

    def dispatch(self, step: Step[Any, Any], kind: Kind) -> None:
        """Send a new attempt (``saga/core/commands.py``)."""
        self.commands.dispatch(step, kind)

    def begin_compensation(self) -> None:
        """Start undoing what completed (``saga/core/compensation_rules.py``)."""
        self.undo.begin_compensation()

    def continue_compensation(self) -> None:
        """Undo the next thing not yet undone (``saga/core/compensation_rules.py``)."""
        self.undo.continue_compensation()
