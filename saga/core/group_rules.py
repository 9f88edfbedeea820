"""The decider's rules for group steps (parallel, first-of-N, map) and child sagas.

Part of the pure decider (``saga/core/decider.py``). A group step's record holds a small
:class:`~saga.core.model.GroupState` (counters and the branches in flight); each branch that
has started has its own record in ``SagaState.branches`` under ``<group>#<index>``, and is
decided exactly like a step whose name is that key: its commands carry the key (and so
their own idempotency key ``<saga>:<group>#<index>:<do|undo>``), its replies and timers name
it, and it retries, times out and compensates by its branch step's policies.

The rules, in the order things happen:

- **fan-out**: branches start in index order, at most ``concurrency`` in flight; one more
  starts each time one ends (``fill``);
- **fan-in**: ``parallel`` and ``map`` succeed once every branch succeeded; ``first_of``
  once a branch won and the others have settled. It happens once: the group step moves to
  ``succeeded`` and the saga's cursor past it in the decision that settles the last branch;
- **closing**: a branch that fails for good (``parallel``, ``map``; for ``first_of``, the
  last one), a winner (``first_of``), a cancel or the deadline close the group: no further
  branch starts, a branch waiting to retry after a failed reply is cancelled (it is known
  to have had no effect), in-flight child sagas are cancelled, and the branches still in
  flight are *awaited*. An attempt in flight may take effect, and compensation runs in
  strict reverse order of completion, so its outcome must be known first: a success is
  recorded (and undone), a failure is not retried, a timeout is retried (its outcome is
  unknown, as for any step). Replies to attempts that already ended change nothing;
- **settling** a closed group once nothing is in flight: a ``first_of`` winner's group
  first undoes the other branches that completed, then succeeds; any other closed group
  fails and the saga compensates -- the group's completed branches in reverse order of
  completion, then the earlier steps -- or, when a branch ran out of attempts (or its
  outcome is unknown), the saga is dead-lettered for an operator.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import msgspec

from redsaga.ids import derived_id
from saga.core.child_messages import CHILD, CancelChild, child_saga_id
from saga.core.effects import Dispatch
from saga.core.model import NULL, GroupState, Note, SagaState, StepState
from saga.core.rules import Run
from saga.core.states import SagaStatus, StepStatus, move_saga, move_step
from saga.definition.saga import Saga, Step
from saga.errors import TooManyItems

_json = msgspec.json.Encoder()

FAILED = "failed"
"""A branch failed for good (``first_of``: every branch did): compensate."""
EXHAUSTED = "exhausted"
"""A branch ran out of attempts, or its outcome is unknown: dead-letter for an operator."""
WON = "won"
"""A ``first_of`` branch succeeded: undo the others that completed, then go on."""
STOPPED = "stopped"
"""Cancel or deadline: compensate."""
_UNDOING = frozenset({StepStatus.COMPENSATING, StepStatus.COMPENSATION_RETRYING})
_IN_FLIGHT = frozenset({StepStatus.DISPATCHED, StepStatus.RETRYING})


def branch_key(group: str, index: int) -> str:
    """The record key (and command step name) of branch ``index`` of ``group``."""
    return f"{group}#{index}"


def split_key(key: str) -> tuple[str, int]:
    """``(group, index)`` of a branch key."""
    group, _, index = key.rpartition("#")
    return group, int(index)


def branch_keys(state: SagaState, group: str) -> Iterator[str]:
    """The keys of the branches of ``group`` that have started."""
    prefix = f"{group}#"
    return (key for key in state.branches if key.startswith(prefix))


def completed_output(definition: Saga[Any], state: SagaState, name: str) -> bytes:
    """The output of step ``name``, which succeeded, as ``ctx.output`` reads it.

    A map's output, the list of its branches' outputs in item order, is never stored (it
    grows with the items): it is built here from the branch records. Every other step's
    output is its record's.
    """
    step = definition.step_named(name)
    if step.group is None or not step.group.dynamic:
        return bytes(state.steps[name].output)
    group = state.steps[name].group
    total = group.total if group is not None else 0
    return b"[" + b",".join(bytes(state.branches[branch_key(name, i)].output) for i in range(total)) + b"]"


class GroupRules:
    """Group steps and their branches, for a decision in progress.

    It calls on the decision (:class:`~saga.core.rules.Run`): ``record`` and ``bound`` (a
    branch's record and step), ``dispatch`` (a branch's command), ``succeeded`` (the group's
    fan-in), ``begin_compensation`` and ``continue_compensation`` (a group that failed, or
    drained while compensating), ``cancel_timer`` and ``stopping``.
    """

    def __init__(self, run: Run) -> None:
        self.run = run

    # -- records ---------------------------------------------------------------------------

    def group_of(self, step: Step[Any, Any]) -> tuple[Step[Any, Any], StepState, GroupState]:
        """A branch's group step, its record and its group state."""
        group_step = self.run.definition.step_named(step.within)
        group_state = self.run.writable(group_step.name)
        assert group_state.group is not None  # noqa: S101 - a started group has its state
        return group_step, group_state, group_state.group

    # -- beginning a group -----------------------------------------------------------------

    def begin_group(self, step: Step[Any, Any]) -> None:
        """Start a group step's first branches (or fail it: a map's items are refused)."""
        spec = step.group
        assert spec is not None  # noqa: S101 - only group steps begin as groups
        step_state = self.run.writable(step.name)
        try:
            total = spec.count(self.run.definition.decode_data(self.run.state.data))
        except TooManyItems as error:
            self._refuse(step, step_state, str(error))
            return
        except Exception as error:  # noqa: BLE001 - a user function's bug fails the step, not the worker
            self._refuse(step, step_state, f"items() raised {type(error).__name__}: {error}")
            return
        step_state.status = move_step(step_state.status, StepStatus.DISPATCHED)
        step_state.group = GroupState(total=total)
        if total == 0:
            self.run.succeeded(step, step_state, self.group_output(step))
            return
        self.fill(step)

    def _refuse(self, step: Step[Any, Any], step_state: StepState, reason: str) -> None:
        """Fail a group step whose items could not be had, and compensate."""
        step_state.status = move_step(step_state.status, StepStatus.FAILED)
        self.run.state.error = Note(
            at_ms=self.run.now_ms, what="group refused", step=step.name, reason=reason
        )
        self.run.begin_compensation()

    def fill(self, group_step: Step[Any, Any]) -> None:
        """Start branches in index order while the group is open and has free slots."""
        spec = group_step.group
        group = self.run.writable(group_step.name).group
        assert spec is not None  # noqa: S101 - a group step
        assert group is not None  # noqa: S101 - a started group
        limit = spec.concurrency or group.total
        while not group.closed and group.started < group.total and len(group.running) < limit:
            index = group.started
            group.started += 1
            group.running.append(index)
            key = branch_key(group_step.name, index)
            self.run.add_branch(key)
            self.run.dispatch(self.run.bound(key), "do")

    # -- branch outcomes -------------------------------------------------------------------

    def branch_succeeded(self, step: Step[Any, Any], record: StepState, output: msgspec.Raw) -> None:
        """A branch completed: rank it, then settle its group (fan-in, winner, or drain)."""
        record.status = move_step(record.status, StepStatus.SUCCEEDED)
        record.output = output
        group_step, _, group = self.group_of(step)
        _, index = split_key(step.name)
        group.completions += 1
        record.seq = group.completions
        group.succeeded += 1
        if index in group.running:
            group.running.remove(index)
        first = group_step.group is not None and group_step.group.mode == "first"
        if first and group.winner < 0 and not group.closed:
            group.winner = index
            self.close_group(group_step, WON, f"branch {index} ({step.name}) won")
        self.settle_group(group_step)

    def branch_failed(self, step: Step[Any, Any], *, exhausted: bool, unknown: bool) -> None:
        """A branch ended without success (its record is ``failed`` already)."""
        group_step, _, group = self.group_of(step)
        _, index = split_key(step.name)
        if index in group.running:
            group.running.remove(index)
        group.failed += 1
        spec = group_step.group
        assert spec is not None  # noqa: S101 - a group step
        last = self.run.state.branches[step.name].current("do")
        error = f": {last.error}" if last is not None and last.error else ""
        if unknown or exhausted:
            why = "its outcome is unknown" if unknown else "it ran out of attempts"
            self.close_group(group_step, EXHAUSTED, f"branch {index} failed ({why}){error}")
        elif spec.mode == "all":
            self.close_group(group_step, FAILED, f"branch {index} ({step.name}) failed for good{error}")
        elif group.failed >= group.total:
            self.close_group(group_step, FAILED, "every branch failed")
        self.settle_group(group_step)

    def branch_cancelling(self, step: Step[Any, Any]) -> bool:
        """Whether a branch's group is closed: its transient failures are not retried."""
        if not step.within:
            return False
        group = self.run.state.steps[step.within].group
        return group is not None and bool(group.closed)

    # -- closing and settling --------------------------------------------------------------

    def close_group(self, group_step: Step[Any, Any], reason: str, why: str) -> None:
        """Start no further branch; cancel what is known to have had no effect; await the rest.

        A later reason overrides ``won`` (a cancel after a winner undoes the winner too) and
        ``exhausted`` wins over ``failed`` (an unknown outcome must reach an operator).
        """
        group = self.run.writable(group_step.name).group
        assert group is not None  # noqa: S101 - a started group
        if not group.closed or group.closed == WON or (reason == EXHAUSTED and group.closed == FAILED):
            group.closed = reason
        if reason not in (WON, STOPPED):  # a cancel or the deadline keeps its own note
            self.run.state.error = Note(
                at_ms=self.run.now_ms, what=f"group {reason}", step=group_step.name, reason=why
            )
        for index in list(group.running):
            key = branch_key(group_step.name, index)
            record = self.run.record(key)
            assert record is not None  # noqa: S101 - running branches have records
            last = record.current("do")
            if record.status == StepStatus.RETRYING and not (last is not None and last.outcome == "timeout"):
                self.run.cancel_timer(record)
                record.status = move_step(record.status, StepStatus.FAILED)
                group.running.remove(index)
                group.failed += 1
            elif record.status == StepStatus.DISPATCHED and last is not None:
                self.cancel_child(self.run.bound(key), last.n, why)

    def cancel_child(self, step: Step[Any, Any], attempt: int, reason: str) -> None:
        """Ask the child saga of an in-flight child step (or branch) to cancel."""
        if step.child is None:
            return
        generation = self.run.state.branches[step.name].generation if "#" in step.name else 0
        message = CancelChild(
            saga=step.child.definition.key,
            saga_id=child_saga_id(self.run.state.id, step.name, generation),
            reason=f"the parent no longer waits for it: {reason}",
        )
        self.run.effects.append(
            Dispatch(
                step=step.name,
                kind="do",
                attempt=attempt,
                participant=CHILD,
                command_id=derived_id(self.run.state.id, f"{step.name}:cancel-child:{attempt}"),
                message_type="CancelChild",
                payload=msgspec.Raw(_json.encode(message)),
            )
        )

    def settle_group(self, group_step: Step[Any, Any]) -> None:
        """Move an open group on, or end a closed one once nothing of it is in flight."""
        step_state = self.run.writable(group_step.name)
        group = step_state.group
        spec = group_step.group
        assert group is not None  # noqa: S101 - a started group
        assert spec is not None  # noqa: S101 - a group step
        if not group.closed:
            if spec.mode == "all" and group.succeeded >= group.total:
                self.run.succeeded(group_step, step_state, self.group_output(group_step))
            else:
                self.fill(group_step)
            return
        if group.running or self.undoing(group_step.name):
            return  # awaiting the branches in flight (or an undo) first
        if self.run.state.status == SagaStatus.COMPENSATING:
            self.run.continue_compensation()
            return
        if group.closed == WON and not self.run.stopping:
            loser = self.next_undo(group_step.name, skip=group.winner)
            if loser is not None:
                self.run.dispatch(self.run.bound(loser), "undo")
                return
            self.run.succeeded(group_step, step_state, self.group_output(group_step))
            return
        step_state.status = move_step(step_state.status, StepStatus.FAILED)
        unknown = self.unknown_branches(group_step.name)
        if unknown:  # never compensated blind: an operator decides (as for a step)
            why = f"{', '.join(unknown)} timed out with no attempts left: outcome unknown"
            self.run.state.error = Note(
                at_ms=self.run.now_ms, what="group stuck", step=group_step.name, reason=why
            )
            self.run.state.status = move_saga(self.run.state.status, SagaStatus.DEAD_LETTERED)
        elif group.closed == EXHAUSTED and not self.run.stopping:
            self.run.state.status = move_saga(self.run.state.status, SagaStatus.DEAD_LETTERED)
        else:
            self.run.begin_compensation()

    def undoing(self, group: str) -> bool:
        """Whether an undo of one of the group's branches is in flight."""
        return any(self.run.state.branches[k].status in _UNDOING for k in branch_keys(self.run.state, group))

    def unknown_branches(self, group: str) -> list[str]:
        """Branches whose last attempt timed out with no attempts left (effect unknown)."""
        found = []
        for key in branch_keys(self.run.state, group):
            record = self.run.state.branches[key]
            last = record.current("do")
            if record.status == StepStatus.FAILED and last is not None and last.outcome == "timeout":
                found.append(key)
        return found

    def next_undo(self, group: str, *, skip: int = -1) -> str | None:
        """The branch to undo next: the latest to complete that has a compensation, not undone."""
        best: tuple[int, str] | None = None
        for key in branch_keys(self.run.state, group):
            record = self.run.state.branches[key]
            if record.status != StepStatus.SUCCEEDED or split_key(key)[1] == skip:
                continue
            if self.run.definition.step_named(key).compensation is None:
                continue
            if best is None or record.seq > best[0]:
                best = (record.seq, key)
        return best[1] if best else None

    # -- outputs ---------------------------------------------------------------------------

    def group_output(self, group_step: Step[Any, Any]) -> msgspec.Raw:
        """What the group step records as its output (a map's list is built when read)."""
        spec = group_step.group
        group = self.run.state.steps[group_step.name].group
        assert spec is not None  # noqa: S101 - a group step
        assert group is not None  # noqa: S101 - a started group
        if spec.dynamic:
            return NULL
        if spec.mode == "first":
            return self.run.state.branches[branch_key(group_step.name, group.winner)].output
        parts = [
            _json.encode(branch.name)
            + b":"
            + bytes(self.run.state.branches[branch_key(group_step.name, i)].output)
            for i, branch in enumerate(spec.branches[: group.total])
        ]
        return msgspec.Raw(b"{" + b",".join(parts) + b"}")

    # -- operator actions ------------------------------------------------------------------

    def retry_group(self, group_step: Step[Any, Any]) -> bool:
        """Operator retry of a dead-lettered group: send the branches that ran out again."""
        step_state = self.run.writable(group_step.name)
        group = step_state.group
        if group is None:
            return False
        again = self.unknown_or_exhausted(group_step.name)
        if not again and group.closed != EXHAUSTED:
            return False
        step_state.status = move_step(step_state.status, StepStatus.DISPATCHED)
        group.closed = ""
        for key in sorted(again, key=lambda k: split_key(k)[1]):
            group.failed -= 1
            group.running.append(split_key(key)[1])
            self.run.dispatch(self.run.bound(key), "do")
        self.settle_group(group_step)
        return True

    def force_branch(
        self, step: Step[Any, Any], record: StepState, output: msgspec.Raw, *, was_failed: bool
    ) -> None:
        """An operator force-completed a branch: count it as completed, reopen the group if clear."""
        group_step, step_state, group = self.group_of(step)
        if was_failed:
            group.failed -= 1
        if step_state.status == StepStatus.FAILED:  # reopened: "an operator retried the step"
            step_state.status = move_step(step_state.status, StepStatus.DISPATCHED)
        if group.closed == EXHAUSTED:
            others = [k for k in self.unknown_or_exhausted(group_step.name) if k != step.name]
            if not others:
                group.closed = ""
        self.branch_succeeded(step, record, output)

    def unknown_or_exhausted(self, group: str) -> list[str]:
        """Branches that failed without a permanent error (out of attempts, or timed out)."""
        return [
            k
            for k in branch_keys(self.run.state, group)
            if self.run.state.branches[k].status == StepStatus.FAILED
            and (last := self.run.state.branches[k].current("do")) is not None
            and last.outcome in ("transient", "timeout")
        ]

    def stop_group(self, group_step: Step[Any, Any]) -> None:
        """Cancel or deadline while a group runs: close it and settle once drained."""
        reason = "cancel requested" if self.run.state.cancel is not None else "deadline exceeded"
        self.close_group(group_step, STOPPED, reason)
        self.settle_group(group_step)

    def group_outcome_unknown(self, group_step: Step[Any, Any]) -> bool:
        """Whether a branch of the group is in flight after a timeout, or timed out for good."""
        for key in branch_keys(self.run.state, group_step.name):
            record = self.run.state.branches[key]
            last = record.current("do")
            if (
                last is not None
                and last.outcome == "timeout"
                and record.status in (*_IN_FLIGHT, StepStatus.FAILED)
            ):
                return True
        return False


def renamed(template: Step[Any, Any], key: str) -> Step[Any, Any]:
    """A copy of a branch step under its record key: what the decision's ``bound`` returns.

    Everything keyed by step name (commands, replies, timers, idempotency keys, notes) then
    names the branch.
    """
    return replace(template, name=key)
