"""The decider's rules for waiting: sleeps, signals, event waits and the saga's deadline.

Part of the pure decider (``saga/core/decider.py``): :class:`WaitRules` is the rule object
a decision composes for everything about a suspended saga. A wait is one attempt of
its step (input: what it waits for; output: the signal's data or the event), the saga is
``suspended`` while it lasts, and it ends exactly once: the first of its timer, its signal
or event, a cancel, the deadline, or an operator's force-complete wins, and whatever comes
after is recorded and ignored. A signal that comes before its wait begins is kept in the
state and consumed when the wait begins (an approval can beat the reply of the step that
asked for it).

An operator redrive that interrupts a wait makes the step's next wait that same wait again
(:func:`next_wait`): the token sent for it, and an event registered for it, still resume
the saga; a new attempt records it, and timers and the event registration are the
attempt's. A redriven wait that had ended ends at once with what it received.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from redsaga.ids import derived_id
from saga.core.effects import CancelTimer, StartTimer, UnwatchEvent, WatchEvent
from saga.core.model import (
    NULL,
    Attempt,
    EventReceived,
    Note,
    Outcome,
    SignalReceived,
    StepState,
    TimerFired,
    Wait,
    WaitKind,
)
from saga.core.rules import Run
from saga.core.states import SagaStatus, StepStatus, move_saga, move_step
from saga.core.timer_ids import attempt_timer_id, deadline_timer_id
from saga.core.tokens import Signer
from saga.definition.step import Step
from saga.definition.waits import EventWait, Sleep
from saga.errors import DefinitionError

WAIT_PARTICIPANT = "_wait"
"""The ``participant`` recorded on a wait's attempt (nobody is sent anything)."""
_json = msgspec.json.Encoder()


def next_wait(step_state: StepState) -> int:
    """The number of a waiting step's next wait (its resume token names it).

    One more than the waits it made, unless an operator redrive interrupted one: then that
    wait begins again under its own number (``StepState.rewait``).
    """
    return step_state.rewait or step_state.count("do") + 1


class WaitRules:
    """Waits and the deadline, for a decision in progress.

    It calls on the decision (:class:`~saga.core.rules.Run`): ``ignore``, ``succeeded`` (a
    wait ended well), ``begin_compensation`` (it failed), ``cancel_timer`` and ``stop`` (the
    deadline passed). ``signer`` makes resume tokens (``None``: builders get none).
    """

    def __init__(self, run: Run, signer: Signer | None) -> None:
        self.run = run
        self.signer = signer

    # -- tokens ----------------------------------------------------------------------------

    def wait_number(self, name: str) -> int:
        """The current wait of step ``name``, or the next one if it is not waiting."""
        wait = self.run.state.wait
        if wait is not None and wait.step == name:
            return wait.n
        return next_wait(self.run.state.steps[name])

    def tokens(self) -> Callable[[str], str] | None:
        """What ``StepContext.resume_token`` calls (``None`` without a signer)."""
        signer = self.signer
        if signer is None:
            return None

        def token(name: str) -> str:
            if self.run.definition.step_named(name).kind != "signal":
                raise DefinitionError("does not wait for a signal", saga=self.run.definition.name, step=name)
            return signer.token(
                self.run.state.partition,
                self.run.state.id,
                name,
                self.wait_number(name),
                incarnation=self.run.state.created_ms,
                now_ms=self.run.now_ms,
            )

        return token

    # -- beginning a wait ------------------------------------------------------------------

    def begin_wait(self, step: Step[Any, Any]) -> None:
        """Suspend the saga on ``step``, or go on at once when what it waits for has come.

        That is an early signal (or, after a redrive, an early event), or -- when a redrive
        re-runs a wait that had ended -- what the wait received then: a wait that ended is
        not waited for again, as a command that succeeded is answered from its participant's
        first result. The attempt numbers the step's attempts; the wait's own number
        (:func:`next_wait`) names its resume token and its event registration.
        """
        step_state = self.run.writable(step.name)
        previous = step_state.current("do")
        ended = previous.output if previous is not None and previous.outcome in ("ok", "forced") else None
        number = step_state.count("do") + 1
        n = next_wait(step_state)
        step_state.rewait = 0
        step_state.status = move_step(step_state.status, StepStatus.WAITING)
        attempt = Attempt(
            n=number,
            kind="do",
            command_id=derived_id(self.run.state.id, f"{step.name}:wait:{number}"),
            participant=WAIT_PARTICIPANT,
            input_type=step.kind,
            input=NULL,
            dispatched_ms=self.run.now_ms,
        )
        step_state.attempts.append(attempt)
        spec = step.wait
        details: dict[str, object] = {}
        delay_ms, at_ms = 0, None
        try:
            data = self.run.definition.decode_data(self.run.state.data)
            if isinstance(spec, Sleep):
                delay_ms, at_ms = spec.target(data)
                details = {"at_ms": at_ms} if at_ms is not None else {"delay_ms": delay_ms}
            elif isinstance(spec, EventWait):
                details = {
                    "stream": spec.stream.key,
                    "message_type": spec.message_type,
                    "key": spec.key_of_data(data),
                }
        except Exception as error:  # noqa: BLE001 - a user function's bug fails the step, not the worker
            attempt.ended_ms = self.run.now_ms
            reason = f"{step.kind} step raised {type(error).__name__}: {error}"
            self.wait_failed(step, step_state, attempt, "permanent", reason)
            return
        if step.timeout_s:
            details["timeout_ms"] = int(step.timeout_s * 1000)
        attempt.input = msgspec.Raw(_json.encode(details))
        early = self.run.state.signals.pop(f"{step.name}:{n}", None) if ended is None else ended
        if early is not None:
            attempt.outcome, attempt.ended_ms, attempt.output = "ok", self.run.now_ms, early
            self.run.succeeded(step, step_state, early)
            return
        self.run.state.status = move_saga(self.run.state.status, SagaStatus.SUSPENDED)
        wait = Wait(step=step.name, kind=_wait_kind(step), n=n, since_ms=self.run.now_ms)
        if isinstance(spec, EventWait):
            wait.stream, wait.message_type, wait.key = spec.stream.key, spec.message_type, str(details["key"])
            self.run.effects.append(
                WatchEvent(
                    step=step.name,
                    n=n,
                    stream=wait.stream,
                    message_type=wait.message_type,
                    key=wait.key,
                    attempt=0 if number == n else number,
                )
            )
        self.run.state.wait = wait
        if isinstance(spec, Sleep):
            self._start_wait_timer(step_state, step.name, number, "wake", delay_ms=delay_ms, at_ms=at_ms)
        elif step.timeout_s:
            self._start_wait_timer(
                step_state, step.name, number, "timeout", delay_ms=int(step.timeout_s * 1000), at_ms=None
            )

    def _start_wait_timer(
        self,
        step_state: StepState,
        step: str,
        n: int,
        purpose: Literal["wake", "timeout"],
        *,
        delay_ms: int,
        at_ms: int | None,
    ) -> None:
        timer_id = attempt_timer_id(self.run.state.id, step, "wait", n, purpose)
        step_state.timer = timer_id
        self.run.effects.append(
            StartTimer(
                timer_id=timer_id,
                delay_ms=delay_ms,
                at_ms=at_ms,
                purpose=purpose,
                step=step,
                kind="do",
                attempt=n,
            )
        )

    # -- ending a wait ---------------------------------------------------------------------

    def release_wait(self, step_state: StepState) -> None:
        """Forget the current wait: cancel its timer and its event registration."""
        self.run.cancel_timer(step_state)
        wait = self.run.state.wait
        if wait is not None and wait.kind == "event":
            attempt = step_state.current("do")
            number = attempt.n if attempt is not None else wait.n
            self.run.effects.append(
                UnwatchEvent(
                    step=wait.step,
                    n=wait.n,
                    stream=wait.stream,
                    message_type=wait.message_type,
                    key=wait.key,
                    attempt=0 if number == wait.n else number,
                )
            )
        self.run.state.wait = None

    def resume(self, step: Step[Any, Any], step_state: StepState, output: msgspec.Raw) -> None:
        """The wait ended well: record ``output``, go on with the next step."""
        attempt = step_state.current("do")
        assert attempt is not None  # noqa: S101 - a waiting step has its wait's attempt
        attempt.outcome, attempt.ended_ms, attempt.output = "ok", self.run.now_ms, output
        self.release_wait(step_state)
        self.run.state.status = move_saga(self.run.state.status, SagaStatus.RUNNING)
        self.run.succeeded(step, step_state, output)

    def wait_failed(
        self,
        step: Step[Any, Any],
        step_state: StepState,
        attempt: Attempt,
        outcome: Outcome,
        reason: str,
        *,
        note: bool = True,
    ) -> None:
        """The wait failed (timeout, cancel, deadline, a bad key function): compensate.

        ``note=False`` keeps the saga's note (the cancel or deadline that ended the wait).
        """
        attempt.outcome, attempt.error, attempt.ended_ms = outcome, reason, self.run.now_ms
        self.release_wait(step_state)
        step_state.status = move_step(step_state.status, StepStatus.FAILED)
        if note:
            self.run.state.error = Note(
                at_ms=self.run.now_ms, what=f"wait {attempt.n} {outcome}", step=step.name, reason=reason
            )
        self.run.begin_compensation()

    def on_wait_timer(self, step: Step[Any, Any], step_state: StepState, attempt: Attempt) -> None:
        """A waiting step's timer fired: the sleep is over, or the wait timed out."""
        if step.kind == "sleep":
            self.resume(step, step_state, NULL)
            return
        what = "signal" if step.kind == "signal" else "matching event"
        self.wait_failed(step, step_state, attempt, "timeout", f"no {what} within {step.timeout_s:g}s")

    # -- events ----------------------------------------------------------------------------

    def on_signal(self, event: SignalReceived) -> None:
        """A resume token was delivered: resume the wait once, or keep an early signal."""
        if self.run.state.status.terminal:
            self.run.ignore(f"signal after the saga ended ({self.run.state.status})")
            return
        step_state = self.run.state.steps.get(event.step)
        if step_state is None or self.run.definition.step_named(event.step).kind != "signal":
            self.run.ignore(f"step {event.step!r} does not wait for signals")
            return
        wait = self.run.state.wait
        if wait is not None and (wait.step, wait.n) == (event.step, event.n):
            self.resume(self.run.definition.step_named(event.step), self.run.writable(event.step), event.data)
            return
        if not self.keep_early("signal", event.step, step_state, event.n, event.data):
            self.run.ignore(
                f"signal for {event.step}:{event.n} is late or duplicate: that wait is not current"
            )

    def keep_early(self, what: str, step: str, step_state: StepState, n: int, data: msgspec.Raw) -> bool:
        """Keep what came for wait ``n`` of ``step`` before it began, if that wait is next.

        A signal can beat its wait (an approval beats the reply of the step that asked for
        it); an event can only after a redrive interrupted its wait, and came for the wait's
        registration before the redrive removed it. Whether it was dealt with (kept, or ignored
        as a duplicate of one kept).
        """
        upcoming = step_state.status == StepStatus.PENDING and n == next_wait(step_state)
        if not upcoming or self.run.stopping or self.run.state.status == SagaStatus.COMPENSATING:
            return False
        slot = f"{step}:{n}"
        if slot in self.run.state.signals:
            self.run.ignore(f"duplicate {what} for {slot}: an earlier one is kept for the wait")
            return True
        self.run.state.signals[slot] = data
        return True

    def on_event(self, event: EventReceived) -> None:
        """Another context's event matched a wait: resume it once (or keep it for the wait)."""
        wait = self.run.state.wait
        step_state = self.run.state.steps.get(event.step)
        if not self.run.state.status.terminal and step_state is not None:
            if wait is not None and (wait.step, wait.n, wait.kind) == (event.step, event.n, "event"):
                step_state = self.run.writable(event.step)
                self.resume(self.run.definition.step_named(event.step), step_state, event.payload)
                return
            if self.keep_early("event", event.step, step_state, event.n, event.payload):
                return
        self.run.ignore(f"event {event.event_id} for {event.step}:{event.n} is late or duplicate")

    def on_deadline(self, event: TimerFired) -> None:
        """The saga's deadline passed: stop going forward and compensate."""
        if self.run.state.status.terminal:
            self.run.ignore(f"deadline after the saga ended ({self.run.state.status})")
            return
        if self.run.state.expired is not None or event.timer_id != deadline_timer_id(self.run.state.id):
            self.run.ignore("the deadline has passed already")
            return
        seconds = self.run.definition.deadline_s or 0
        note = Note(
            at_ms=event.at_ms, what="deadline exceeded", reason=f"not finished {seconds:g}s after start"
        )
        self.run.state.expired = self.run.state.error = note
        self.run.stop()

    def deadline_effects(self, *, started: bool, was_terminal: bool) -> None:
        """Start the deadline timer with the saga; cancel it when the saga ends before it."""
        seconds = self.run.definition.deadline_s
        if not seconds:
            return
        timer_id = deadline_timer_id(self.run.state.id)
        if started and not self.run.state.status.terminal:
            self.run.effects.append(
                StartTimer(
                    timer_id=timer_id,
                    delay_ms=int(seconds * 1000),
                    purpose="deadline",
                    step="",
                    kind="do",
                    attempt=0,
                )
            )
        elif (
            not started and not was_terminal and self.run.state.status.terminal and not self._deadline_fired()
        ):
            self.run.effects.append(CancelTimer(timer_id=timer_id))

    def _deadline_fired(self) -> bool:
        """Whether the deadline timer has fired (a TCC expiry also sets ``expired``)."""
        expired = self.run.state.expired
        return expired is not None and expired.what == "deadline exceeded"


def _wait_kind(step: Step[Any, Any]) -> WaitKind:
    if step.kind == "sleep":
        return "sleep"
    return "signal" if step.kind == "signal" else "event"
