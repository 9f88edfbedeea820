"""What tests assert about a saga: a comparable summary, the invariants, and replay.

These work on a saga's state and history wherever they came from: the in-process runner,
or Redis (``rs:{ctx:p}:saga:<id>`` and ``rs:{ctx:p}:hist:<id>``), so one assertion serves
every backend.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from saga.core.effects import Dispatch
from saga.core.history_entry import HistoryEntry
from saga.core.model import ForceCompleted, Outcome, RedriveRequested, SagaState, StepReplied
from saga.core.replay import replay_history
from saga.core.states import SAGA_TRANSITIONS, SagaStatus, StepStatus
from saga.core.tokens import Signer
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.errors import ReplayMismatch
from saga.store.history import read_history

_json = msgspec.json.Encoder()
_history_list_decoder = msgspec.json.Decoder(list[HistoryEntry])


@dataclass(frozen=True, slots=True)
class StepSummary:
    """One step's status and the outcomes of its attempts (``None``: still in flight)."""

    status: StepStatus
    do: tuple[Outcome | None, ...] = ()
    undo: tuple[Outcome | None, ...] = ()
    confirm: tuple[Outcome | None, ...] = ()


@dataclass(frozen=True, slots=True)
class Summary:
    """What a scenario test compares: status, step records, completion and undo order.

    Timings, ids and workers are left out, so the same scenario gives equal summaries on
    every backend.
    """

    status: SagaStatus
    steps: dict[str, StepSummary]
    completed: tuple[str, ...]
    compensated: tuple[str, ...]


def summarize(state: SagaState, history: Sequence[HistoryEntry]) -> Summary:
    """Summarize a saga (``compensated`` is the order in which compensations were sent).

    Branches of group steps are in ``steps`` too, under their keys ``<group>#<index>``.
    """
    return Summary(
        status=state.status,
        steps={
            name: StepSummary(
                status=step.status,
                do=tuple(a.outcome for a in step.attempts if a.kind == "do"),
                undo=tuple(a.outcome for a in step.attempts if a.kind == "undo"),
                confirm=tuple(a.outcome for a in step.attempts if a.kind == "confirm"),
            )
            for name, step in [*state.steps.items(), *state.branches.items()]
        },
        completed=tuple(state.completed),
        compensated=tuple(compensation_order(history)),
    )


def compensation_order(history: Iterable[HistoryEntry]) -> list[str]:
    """The steps whose compensation was sent, in the order of their first undo command."""
    order: list[str] = []
    for entry in history:
        for effect in entry.effects:
            if isinstance(effect, Dispatch) and effect.kind == "undo" and effect.step not in order:
                order.append(effect.step)
    return order


def decode_history(
    raw: bytes | str | Iterable[HistoryEntry | bytes | str], *, state: SagaState | None = None
) -> list[HistoryEntry]:
    """Read a history: a JSON array (an exported trace), entries, or the store's entries.

    The store's entries (Redis ``LRANGE``) are compact and refer to the saga's hash for
    what it holds (``saga/store/history.py``): give the saga's ``state`` as read after
    them (``SagaClient.get``) with them; ``SagaAdmin.history`` and exported traces hold
    entries whole already. Raises ``ValueError`` for stored entries read without their
    ``state``.
    """
    if isinstance(raw, bytes | str):
        return _history_list_decoder.decode(raw)
    entries = list(raw)
    stored = [e for e in entries if not isinstance(e, HistoryEntry)]
    if not stored:
        return entries  # type: ignore[return-value] # all of them are entries already
    if state is None or len(stored) != len(entries):
        raise ValueError("the store's history entries are read with their saga: give state= (and only them)")
    return read_history(stored, state)


def invariant_violations(
    definition: Saga[Any], state: SagaState, history: Sequence[HistoryEntry]
) -> list[str]:
    """Everything wrong with a saga by G3, G4 (docs/faults.md) and the lifecycle tables (empty: fine).

    Checked: revisions never go back and ignored events leave them alone; a status changes
    only along the lifecycle table and never after an end; no step completes twice and no
    command is sent for a step (or compensation) after it succeeded -- unless an operator
    redrive re-ran it since (under the same key, so its participant answers with what it
    already did), once per redrive; compensations are sent
    only for completed steps that declare one, in strict reverse order of completion, and
    each succeeds at most once; an ended saga's steps agree with how it ended.
    """
    problems: list[str] = []
    problems += _revision_problems(history)
    problems += _status_problems(history)
    redriven = _redriven(definition, history)
    problems += _dispatch_problems(definition, history)
    # First-of-N clean-up undoes the losers on the forward path (the saga is running):
    # the order rule is about the saga's compensation, so those undos are left out of it.
    forward = _forward_undos(history)
    with_undo = [n for n in completion_order(definition, state) if n not in forward]
    order = [n for n in compensation_order(history) if n not in forward]
    if order != list(reversed(with_undo))[: len(order)]:
        problems.append(
            f"compensations sent in order {order}, expected a prefix of {list(reversed(with_undo))}"
        )
    completed_keys = set(completion_order(definition, state))
    for name, step in [*state.steps.items(), *state.branches.items()]:
        done = sum(1 for a in step.attempts if a.kind == "do" and a.outcome in ("ok", "forced"))
        undone = sum(1 for a in step.attempts if a.kind == "undo" and a.outcome in ("ok", "forced"))
        if done > 1 + redriven[name]:
            problems.append(f"step {name} completed {done} times")
        if undone > 1:
            problems.append(f"step {name} was undone {undone} times")
        if step.count("undo") and name not in completed_keys:
            problems.append(f"step {name} was compensated but did not complete (or declares no compensation)")
    problems += _end_problems(definition, state, [n for n in completed_keys if n not in forward])
    return problems


def completion_order(definition: Saga[Any], state: SagaState) -> list[str]:
    """Completed steps and branches that declare a compensation, in order of completion.

    A group's branches complete in the order of their ``seq``, after the steps before the
    group and before those after it; a group the saga stopped in comes last.
    """
    names = list(state.completed)
    if state.cursor < len(definition.steps):
        current = definition.steps[state.cursor]
        if current.is_group and current.name not in names and current.name in state.steps:
            names.append(current.name)
    order: list[str] = []
    for name in names:
        step = definition.step_named(name)
        if step.is_group:
            prefix = f"{name}#"
            done = [(r.seq, k) for k, r in state.branches.items() if k.startswith(prefix) and r.seq > 0]
            order += [k for _, k in sorted(done) if definition.step_named(k).compensation is not None]
        elif step.compensation is not None:
            order.append(name)
    return order


def _forward_undos(history: Iterable[HistoryEntry]) -> set[str]:
    return {
        effect.step
        for entry in history
        if entry.status == SagaStatus.RUNNING
        for effect in entry.effects
        if isinstance(effect, Dispatch) and effect.kind == "undo"
    }


def _revision_problems(history: Sequence[HistoryEntry]) -> list[str]:
    problems = []
    for before, after in itertools.pairwise(history):
        if after.revision < before.revision:
            problems.append(f"revision went back from {before.revision} to {after.revision}")
        if after.ignored and after.revision != before.revision:
            problems.append(f"an ignored event changed the revision ({after.ignored})")
    return problems


def _status_problems(history: Sequence[HistoryEntry]) -> list[str]:
    problems = []
    for before, after in itertools.pairwise(history):
        if before.status == after.status:
            continue
        if before.status.terminal:
            problems.append(f"status changed after the end: {before.status} -> {after.status}")
        elif after.status not in _reachable(before.status):
            problems.append(f"illegal status change {before.status} -> {after.status}")
    return problems


def _redone(definition: Saga[Any], event: RedriveRequested) -> list[str]:
    """The steps a redrive runs again: its step and every later one."""
    return [s.name for s in definition.steps[definition.step_named(event.step).index :]]


def _redriven(definition: Saga[Any], history: Iterable[HistoryEntry]) -> Counter[str]:
    """How many applied redrives re-ran each step."""
    return Counter(
        name
        for entry in history
        if isinstance(entry.event, RedriveRequested) and not entry.ignored
        for name in _redone(definition, entry.event)
    )


def _dispatch_problems(definition: Saga[Any], history: Sequence[HistoryEntry]) -> list[str]:
    problems: list[str] = []
    finished: set[tuple[str, str]] = set()
    for entry in history:
        event = entry.event
        if isinstance(event, RedriveRequested) and not entry.ignored:
            finished -= {(name, "do") for name in _redone(definition, event)}
        problems.extend(
            f"{effect.step}/{effect.kind} sent again after it succeeded"
            for effect in entry.effects
            if isinstance(effect, Dispatch) and (effect.step, effect.kind) in finished
        )
        if entry.ignored:
            continue
        if isinstance(event, StepReplied) and event.ok:
            finished.add((event.step, event.kind))
        elif isinstance(event, ForceCompleted):
            finished.add((event.step, "undo" if (event.step, "do") in finished else "do"))
    return problems


def _end_problems(definition: Saga[Any], state: SagaState, with_undo: list[str]) -> list[str]:
    status, steps = state.status, state.steps
    problems = []
    finished = (StepStatus.SUCCEEDED, StepStatus.CONFIRMED)
    if status == SagaStatus.COMPLETED and any(s.status not in finished for s in steps.values()):
        problems.append("completed, but not every step succeeded")
    if status == SagaStatus.COMPLETED:
        for name, step in steps.items():
            spec = definition.step_named(name).group
            if spec is not None and spec.mode == "all" and step.group is not None:
                keys = [f"{name}#{i}" for i in range(step.group.total)]
                if any(
                    k not in state.branches or state.branches[k].status != StepStatus.SUCCEEDED for k in keys
                ):
                    problems.append(f"completed, but not every branch of {name} succeeded")
    every = [*steps.values(), *state.branches.values()]
    if status in (SagaStatus.COMPLETED, SagaStatus.FAILED) and any(s.count("undo") for s in every):
        undone = [n for n, s in [*steps.items(), *state.branches.items()] if s.count("undo")]
        if status == SagaStatus.FAILED or any(n not in _losers(definition, state) for n in undone):
            problems.append(f"{status}, yet compensations were sent")
    if status == SagaStatus.FAILED and with_undo:
        problems.append(f"failed, yet completed steps {with_undo} needed undoing")
    if status in (SagaStatus.COMPENSATED, SagaStatus.CANCELLED):
        left = [n for n in with_undo if (steps.get(n) or state.branches[n]).status != StepStatus.COMPENSATED]
        if left:
            problems.append(f"{status}, but steps {left} were not undone")
    return problems


def _losers(definition: Saga[Any], state: SagaState) -> set[str]:
    """Branches of first-of-N groups other than the winner."""
    losers = set()
    for name, step in state.steps.items():
        spec = definition.step_named(name).group
        if spec is not None and spec.mode == "first" and step.group is not None:
            losers |= {
                k for k in state.branches if k.startswith(f"{name}#") and k != f"{name}#{step.group.winner}"
            }
    return losers


def _reachable(status: SagaStatus) -> set[SagaStatus]:
    seen: set[SagaStatus] = set()
    todo = [status]
    while todo:
        for target in SAGA_TRANSITIONS[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def replay(
    definition: Saga[Any] | Registry | Iterable[Saga[Any]],
    history: bytes | str | Iterable[HistoryEntry | bytes | str],
    *,
    saga_id: str,
    partition: int = 0,
    signer: Signer | None = None,
    state: SagaState | None = None,
) -> SagaState:
    """Run a recorded history through the decider again and return the state it rebuilds.

    Every entry's effects, resulting status, revision and whether it was ignored must come
    out the same, or :class:`ReplayMismatch` names the first entry that differs: the
    regression test for a definition change (replay yesterday's production traces against
    today's code). ``history`` is what the store records (``LRANGE rs:{ctx:p}:hist:<id> 0 -1``,
    with the saga's ``state`` as read after it, see :func:`decode_history`; or entries from
    ``SagaAdmin.history``, or a JSON array of them); versions and migrations are handled as
    :func:`saga.core.replay.replay_history` says. Sagas whose builders put resume tokens in their
    commands need the context's ``signer`` (``Signer.from_secret(secret, context)``).
    """
    report = replay_history(
        definition, decode_history(history, state=state), saga_id=saga_id, partition=partition, signer=signer
    )
    if report.mismatch is not None:
        raise ReplayMismatch(report.mismatch, saga_id=saga_id)
    if report.state is None:
        raise ValueError("an empty history: a history starts with the saga's Started event")
    return report.state
