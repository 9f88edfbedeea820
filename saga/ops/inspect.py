"""What ``saga inspect`` shows: a saga's state explained, built from what the store holds.

Pure: the admin client reads the state, the history, the saga's pending timers and its
dead letters, and :func:`build_inspection` turns them into one :class:`Inspection` that
says where the saga is and what it waits for, in words an on-call engineer can act on.
The definition's registered shape (``saga/definition/shape.py``) orders the steps and names their
kinds and compensations, so no code is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from bus import DeadLetter
from saga.core.history_entry import HistoryEntry
from saga.core.model import Attempt, GroupState, Kind, Note, ParentLink, SagaState, StepState, Wait
from saga.core.rate_rules import held
from saga.core.states import SagaStatus, StepStatus
from saga.core.task_rules import TaskLog
from saga.definition.shape import Shape, StepShape
from saga.ops.durations import human_ms
from saga.ops.task_view import TaskView
from saga.ops.timeline import TimelineRow, merge_task_log, timeline_row
from saga.store.slots import Place


class TimerView(msgspec.Struct, kw_only=True):
    """A pending timer of the saga (a retry back-off or an attempt's timeout)."""

    timer_id: str
    purpose: str
    step: str
    kind: str
    attempt: int
    due_ms: int | None
    due_in_ms: int | None


class StepView(msgspec.Struct, kw_only=True):
    """One step: its status, every attempt (input, output or error, timings, worker).

    A group step (``parallel``, ``first_of``, ``map``) also has its ``group`` summary; its
    branches are in :attr:`Inspection.branches`.
    """

    name: str
    status: StepStatus
    compensation: str | None
    generation: int
    output: msgspec.Raw
    attempts: list[Attempt]
    kind: str = ""
    group: GroupState | None = None


class BranchView(msgspec.Struct, kw_only=True):
    """One branch of a group step that has started.

    ``key`` is ``<group>#<index>`` (what its commands, replies and timers name), ``branch``
    the name of the branch step it runs, ``completed`` its rank in the group's completion
    order (0: not completed).
    """

    key: str
    group: str
    index: int
    branch: str
    status: StepStatus
    completed: int
    compensation: str | None
    output: msgspec.Raw
    attempts: list[Attempt]


class Inspection(msgspec.Struct, kw_only=True):
    """Everything ``saga inspect`` reports about one saga.

    ``waiting_for`` says in one sentence what would move the saga next; ``error_chain`` is
    the last failed attempt's error, cause by cause; ``dead_letters`` are the letters of
    the saga's partition that name it (bad replies, poison commands). ``history`` holds the
    full entries only when they were asked for (``history_omitted`` says when they were
    left out); ``timeline`` always summarises them. ``graph`` is the saga's path over its
    definition's diagram, when asked for. ``wait`` is what a suspended saga waits for (a
    sleep, signal or event; its deadline is among the ``timers``); ``task`` the open human
    task it waits for (then ``waiting_for`` speaks of the task, not of its signal wait).
    """

    id: str
    definition: str
    version: int
    context: str
    partition: int
    status: SagaStatus
    revision: int
    created_ms: int
    updated_ms: int
    idle_ms: int
    data: msgspec.Raw
    current_step: str
    waiting_for: str
    steps: list[StepView]
    timers: list[TimerView]
    last_error: Note | None
    cancel: Note | None
    error_chain: list[str]
    dead_letters: list[DeadLetter]
    timeline: list[TimelineRow]
    history: list[HistoryEntry]
    tasks: list[TaskLog] = msgspec.field(default_factory=list)
    history_omitted: bool = False
    branches: list[BranchView] = msgspec.field(default_factory=list)
    parent: ParentLink | None = None
    graph: str | None = None
    wait: Wait | None = None
    task: TaskView | None = None


def build_inspection(
    state: SagaState,
    history: Sequence[HistoryEntry],
    timers: Sequence[TimerView],
    letters: Sequence[DeadLetter],
    *,
    now_ms: int,
    shape: Shape | None,
    full_history: bool,
    task_log: Sequence[TaskLog] = (),
) -> Inspection:
    """Explain ``state``; its definition's ``shape``, when known, orders the steps and names them."""
    names = [s.name for s in shape.steps] if shape else _dispatch_order(state)
    steps = [
        StepView(
            name=name,
            status=state.steps[name].status,
            compensation=_compensation(_step(shape, name)),
            generation=state.steps[name].generation,
            output=state.steps[name].output,
            attempts=state.steps[name].attempts,
            kind=step.kind if (step := _step(shape, name)) else "",
            group=state.steps[name].group,
        )
        for name in names
        if name in state.steps
    ]
    current, waiting = waiting_for(state, names, timers, now_ms)
    return Inspection(
        id=state.id,
        definition=state.name,
        version=state.version,
        context=state.context,
        partition=state.partition,
        status=state.status,
        revision=state.revision,
        created_ms=state.created_ms,
        updated_ms=state.updated_ms,
        idle_ms=max(0, now_ms - state.updated_ms),
        data=state.data,
        current_step=current,
        waiting_for=waiting,
        steps=steps,
        timers=list(timers),
        last_error=state.error,
        cancel=state.cancel,
        error_chain=error_chain(state),
        dead_letters=list(letters),
        timeline=merge_task_log([timeline_row(i, e) for i, e in enumerate(history)], task_log),
        history=list(history) if full_history else [],
        tasks=list(task_log),
        history_omitted=not full_history,
        branches=branch_views(state, shape, names),
        parent=state.parent,
        wait=state.wait,
    )


def branch_views(state: SagaState, shape: Shape | None, order: Sequence[str]) -> list[BranchView]:
    """The started branches of every group step, by group (in step ``order``) then index."""
    views = []
    for key, record in state.branches.items():
        group, _, index = key.rpartition("#")
        step = _step(shape, key)
        views.append(
            BranchView(
                key=key,
                group=group,
                index=int(index),
                branch=step.name if step else group,
                status=record.status,
                completed=record.seq,
                compensation=_compensation(step),
                output=record.output,
                attempts=record.attempts,
            )
        )
    position = {name: n for n, name in enumerate(order)}
    return sorted(views, key=lambda v: (position.get(v.group, len(position)), v.group, v.index))


SLOT_WAIT = "a slot of its concurrency key"
"""How :func:`waiting_for` begins for a saga in a concurrency key's line (the reader adds its place)."""


def slot_waiting(waiting: str, place: Place | None) -> str:
    """:func:`waiting_for`'s answer for a saga in line, with its place when it could be read."""
    if place is None:
        return waiting
    nth = {1: "1st", 2: "2nd", 3: "3rd"}.get(place.place, f"{place.place}th")
    line = f"a slot of {place.name} {place.value}, {nth} in line ({place.waiting} waiting)"
    return line + waiting[len(SLOT_WAIT) :]


def waiting_for(  # noqa: PLR0911 - one answer per kind of wait
    state: SagaState, order: Sequence[str], timers: Sequence[TimerView], now_ms: int
) -> tuple[str, str]:
    """``(current step, what would move the saga next)``."""
    if state.status.terminal:
        return "", f"nothing: the saga ended ({state.status})"
    step_name, step = _current(state, order)
    if step_name is None or step is None:
        return "", "its next event"
    if state.status == SagaStatus.DEAD_LETTERED:
        undo = step.status == StepStatus.COMPENSATION_FAILED
        what = f"the compensation of {step_name}" if undo else step_name
        error = state.error.reason if state.error else "no error recorded"
        return step_name, (
            f"an operator: {what} ran out of attempts ({error}); "
            "retry, force-complete, replay --from-step or cancel it"
        )
    if step.group is not None and step.status == StepStatus.DISPATCHED:
        return step_name, _group_waiting(step_name, step.group, state)
    kind: Kind = (
        "undo" if step.status in (StepStatus.COMPENSATING, StepStatus.COMPENSATION_RETRYING) else "do"
    )
    attempt = step.current(kind)
    timer = next((t for t in timers if t.timer_id == step.timer), None)
    due = f"due in {human_ms(timer.due_in_ms)}" if timer and timer.due_in_ms is not None else "pending"
    if step.status in (StepStatus.RETRYING, StepStatus.COMPENSATION_RETRYING):
        return step_name, f"the retry back-off of {step_name}/{kind} (attempt {step.count(kind) + 1} {due})"
    if attempt is not None and held(state.id, step_name, step) is attempt:
        return step_name, f"a rate limit's token for its command to {attempt.participant} ({due})"
    if attempt is not None and held(state.id, step_name, step, "slot") is attempt:
        return step_name, f"{SLOT_WAIT} (its next look at the line {due})"
    if attempt is None or attempt.outcome is not None:
        return step_name, f"{step_name} to be dispatched"
    sent = human_ms(max(0, now_ms - attempt.dispatched_ms))
    line = (
        f"a reply from {attempt.participant} to {attempt.input_type} "
        f"({step_name}/{kind} attempt {attempt.n}, sent {sent} ago"
    )
    if timer is not None and timer.due_in_ms is not None:
        line += f"; times out in {human_ms(timer.due_in_ms)}" if timer.due_in_ms > 0 else "; timeout overdue"
    elif timer is None:
        line += "; no timeout set"
    line += ")"
    if state.cancel is not None:
        line += "; cancel requested: it compensates once this attempt ends"
    return step_name, line


def _group_waiting(name: str, group: GroupState, state: SagaState) -> str:
    """What a running group step waits for, in one sentence."""
    done = f"{group.succeeded} of {group.total} branches of {name} succeeded"
    if group.failed:
        done += f", {group.failed} failed"
    running = ", ".join(f"{name}#{i}" for i in group.running[:5]) + (" ..." if len(group.running) > 5 else "")
    undoing = [
        k
        for k, r in state.branches.items()
        if k.startswith(f"{name}#")
        and r.count("undo")
        and r.status in (StepStatus.COMPENSATING, StepStatus.COMPENSATION_RETRYING)
    ]
    if group.closed:
        why = {
            "won": "a branch won",
            "failed": "a branch failed",
            "exhausted": "a branch ran out of attempts",
            "stopped": "the saga is stopping",
        }.get(group.closed, group.closed)
        if group.running:
            return (
                f"{done}; no more start ({why}): waiting for the {len(group.running)} in flight ({running})"
            )
        if undoing:
            return f"{done}; {why}: undoing {', '.join(undoing)} before going on"
        return f"{done}; {why}"
    left = group.total - group.started
    more = f", {left} not started yet" if left else ""
    return f"{done}; replies from {len(group.running)} in flight ({running}){more}"


def error_chain(state: SagaState) -> list[str]:
    """The last failed attempt's error, cause by cause (``A <- B`` chains split)."""
    failed = [a for s in state.steps.values() for a in s.attempts if a.error]
    if not failed:
        return []
    last = max(failed, key=lambda a: (a.ended_ms or a.dispatched_ms, a.n))
    return [link.strip() for link in (last.error or "").split(" <- ")]


def _current(state: SagaState, order: Sequence[str]) -> tuple[str | None, StepState | None]:
    if state.status == SagaStatus.COMPENSATING or any(
        s.status == StepStatus.COMPENSATION_FAILED for s in state.steps.values()
    ):
        busy = (StepStatus.COMPENSATING, StepStatus.COMPENSATION_RETRYING, StepStatus.COMPENSATION_FAILED)
        for name in reversed(state.completed):
            if state.steps[name].status in busy:
                return name, state.steps[name]
    if state.cursor < len(order):
        name = order[state.cursor]
        return name, state.steps.get(name)
    return None, None


def _dispatch_order(state: SagaState) -> list[str]:
    """Step order without the definition: by first dispatch, never-dispatched steps last."""

    def first(name: str) -> tuple[int, str]:
        attempts = state.steps[name].attempts
        return (attempts[0].dispatched_ms if attempts else 2**62, name)

    return sorted(state.steps, key=first)


def _step(shape: Shape | None, name: str) -> StepShape | None:
    """The step (or branch) ``name`` of ``shape``; ``None`` when unknown (a step the shape lacks)."""
    if shape is None:
        return None
    try:
        return shape.step_named(name)
    except KeyError:
        return None


def _compensation(step: StepShape | None) -> str | None:
    return step.compensation.name if step and step.compensation else None
