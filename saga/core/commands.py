"""The commands the decider sends: attempts, their builders, timeouts and retry policies.

Part of the pure decider (``saga/core/decider.py``). Every ``do``, ``undo`` and ``confirm``
attempt is one :class:`~saga.core.effects.Dispatch` with a command id derived from the saga, the
step and the attempt number (so redeliveries and replays send the same command), and, when
the step (or compensation) has a timeout, a timer. The command is what the step's builder
returns; a local action's attempt carries a :class:`LocalCall` for the worker instead, and a
child step's a :class:`~saga.core.child_messages.StartChild`. A builder that raises fails the
step for good (a bug in a builder must not stop the worker).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec

from redsaga.ids import message_type
from saga.core.child_messages import CHILD, StartChild, child_saga_id
from saga.core.command_ids import command_id as derive_command_id
from saga.core.effects import Dispatch, StartTimer
from saga.core.group_rules import completed_output
from saga.core.model import NULL, Attempt, Kind, ParentLink, StepState
from saga.core.rules import Run
from saga.core.states import StepStatus, move_step
from saga.core.timer_ids import attempt_timer_id
from saga.core.wait_rules import WaitRules
from saga.definition.retry import Retry
from saga.definition.step import LOCAL, Command, Compensation, Step, StepContext, invoke
from saga.errors import DefinitionError

_json = msgspec.json.Encoder()


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


class Commands:
    """Sending attempts, for a decision in progress.

    It calls on the decision (:class:`~saga.core.rules.Run`): ``record``, ``cancel_timer``
    and ``failed`` (a builder raised); the wait rules give the resume tokens builders make.
    """

    def __init__(self, run: Run, waits: WaitRules) -> None:
        self.run = run
        self.waits = waits

    def dispatch(self, step: Step[Any, Any], kind: Kind) -> None:
        """Send a new attempt of the step's ``kind``, with its timeout timer (a builder bug fails it)."""
        step_state = self.run.record(step.name)
        assert step_state is not None  # noqa: S101 - only started steps and branches are sent
        self.run.cancel_timer(step_state)  # a TCC step's expiry timer, once it is confirmed or undone
        n = step_state.count(kind) + 1
        command_id = derive_command_id(self.run.state.id, step.name, kind, n)
        target_status = {
            "do": StepStatus.DISPATCHED,
            "undo": StepStatus.COMPENSATING,
            "confirm": StepStatus.CONFIRMING,
        }[kind]
        step_state.status = move_step(step_state.status, target_status)
        try:
            participant, type_name, payload = self.build(step, kind, n, command_id)
        except Exception as error:  # noqa: BLE001 - a builder bug fails the step, not the worker
            attempt = Attempt(
                n=n,
                kind=kind,
                command_id=command_id,
                participant="?",
                input_type="?",
                input=msgspec.Raw(b"null"),
                dispatched_ms=self.run.now_ms,
                ended_ms=self.run.now_ms,
            )
            step_state.attempts.append(attempt)
            self.run.failed(
                step, step_state, attempt, f"builder raised {type(error).__name__}: {error}", "permanent"
            )
            return
        attempt = Attempt(
            n=n,
            kind=kind,
            command_id=command_id,
            participant=participant,
            input_type=type_name,
            input=msgspec.Raw(payload),
            dispatched_ms=self.run.now_ms,
        )
        step_state.attempts.append(attempt)
        self.send(step, step_state, attempt)

    def send(self, step: Step[Any, Any], step_state: StepState, attempt: Attempt) -> None:
        """Send ``attempt``'s command (made, or held for a rate limit), with its timeout timer."""
        kind, n = attempt.kind, attempt.n
        timeout = self.timeout(step, kind)
        self.run.effects.append(
            Dispatch(
                step=step.name,
                kind=kind,
                attempt=n,
                participant=attempt.participant,
                command_id=attempt.command_id,
                message_type=attempt.input_type,
                payload=attempt.input,
                timeout_ms=int(timeout * 1000) if timeout else None,
            )
        )
        if timeout:
            timer_id = attempt_timer_id(self.run.state.id, step.name, kind, n, "timeout")
            step_state.timer = timer_id
            self.run.effects.append(
                StartTimer(
                    timer_id=timer_id,
                    delay_ms=int(timeout * 1000),
                    purpose="timeout",
                    step=step.name,
                    kind=kind,
                    attempt=n,
                )
            )

    def build(self, step: Step[Any, Any], kind: Kind, n: int, command_id: str) -> tuple[str, str, bytes]:
        """Run the step's (or its compensation's) builder: (participant, message type, payload)."""
        target = self.target(step, kind)
        outputs = Outputs(self.run, step.name)
        if kind == "do" and step.child is not None:
            return self._build_child(step, n, command_id)
        if target.local:
            waits = {
                s.name: self.waits.wait_number(s.name)
                for s in self.run.definition.steps
                if s.kind == "signal"
            }
            call = LocalCall(
                data=self.run.state.data,
                outputs={k: msgspec.Raw(v) for k, v in outputs.items()},
                waits=waits,
                incarnation=self.run.state.created_ms if waits else 0,
                at_ms=self.run.now_ms if waits else 0,
            )
            return LOCAL, message_type(LocalCall), _json.encode(call)
        context = StepContext(self.run.state.id, step.name, n, outputs, self.waits.tokens())
        built = invoke(target, self.run.definition.decode_data(self.run.state.data), context)
        if not isinstance(built, Command):
            raise DefinitionError(
                f"the builder returned {type(built).__name__}, not command(...)",
                saga=step.saga,
                step=step.name,
            )
        return built.participant, message_type(type(built.message)), _json.encode(built.message)

    def _build_child(self, step: Step[Any, Any], n: int, command_id: str) -> tuple[str, str, bytes]:
        """The command that starts a child saga, with the link it reports its end through."""
        spec = step.child
        assert spec is not None  # noqa: S101 - child steps only
        data = self.run.definition.decode_data(self.run.state.data)
        if spec.per_item:
            group = self.run.definition.step_named(step.within).group
            assert group is not None  # noqa: S101 - a map's child
            child_data = spec.data(data, group.items_of(data)[int(step.name.rpartition("#")[2])])
        else:
            child_data = spec.data(data)
        record = self.run.record(step.name)
        assert record is not None  # noqa: S101 - a started step
        message = StartChild(
            saga=spec.definition.key,
            saga_id=child_saga_id(self.run.state.id, step.name, record.generation),
            data=msgspec.Raw(spec.definition.encode_data(child_data)),
            parent=ParentLink(
                context=self.run.state.context,
                partition=self.run.state.partition,
                saga_id=self.run.state.id,
                saga=self.run.definition.key,
                step=step.name,
                attempt=n,
                command_id=command_id,
                incarnation=self.run.state.created_ms,
            ),
        )
        return CHILD, message_type(StartChild), _json.encode(message)

    def target(self, step: Step[Any, Any], kind: Kind) -> Step[Any, Any] | Compensation:
        """What an attempt of ``kind`` runs: the step, its compensation or its confirmation."""
        if kind == "do":
            return step
        target = step.compensation if kind == "undo" else step.confirmation
        assert target is not None  # noqa: S101 - undo (confirm) attempts exist only when declared
        return target

    def policy(self, step: Step[Any, Any], kind: Kind) -> Retry:
        """The retry policy of an attempt of ``kind``."""
        target = self.target(step, kind)
        return target.retry

    def timeout(self, step: Step[Any, Any], kind: Kind) -> float | None:
        """The timeout of an attempt of ``kind``, in seconds (``None``: none)."""
        if kind == "do":
            return step.timeout_s
        return self.target(step, kind).timeout_s


class Outputs(Mapping[str, bytes]):
    """The outputs a builder can read (``StepContext.output``), computed when asked for.

    Completed steps by name; a completed ``parallel`` group's branches by their own names;
    a map's list of outputs (built from its branch records only if read); and, for a branch
    (in its builder or compensation), its own output under its key ``<group>#<index>``.
    """

    def __init__(self, run: Run, current: str) -> None:
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
