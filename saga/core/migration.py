"""Migrations: moving in-flight sagas from one definition version to the next. Pure.

The user writes a function from an :class:`Instance` of the source version to a
:class:`Plan` (how its steps map onto the target version, its new data, replaced step
outputs); :func:`migration` declares it. ``saga/versions/migrator.py`` runs it over the in-flight
instances in Redis; :class:`saga.testing.SagaRunner` runs it in-process. Both call
:func:`plan_event` and :func:`migrate_state` here, and replay applies a recorded
:class:`~saga.core.model.Migrated` entry with :func:`migrate_state` again, without the user's function.

A migration re-labels an instance; it never runs a step itself. So an instance is refused
(and left untouched) when the plan would leave it unable to go on: a step that has run
must map to a step of the target, a completed step that still has to be undone must keep a
compensation, a step with an attempt or a timer in flight keeps its name and kind (replies
and timers find their step by name), a local action in flight is waited for, and every
target step before the instance's position must have run or be skipped explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import msgspec

from saga.core.group_rules import completed_output
from saga.core.model import Migrated, SagaState, StepState
from saga.core.states import SagaStatus, StepStatus
from saga.definition.saga import Saga, Step
from saga.definition.shape import step_shape
from saga.errors import InvalidInput, MigrationRefused

D = TypeVar("D")
_json = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(SagaState)

KEEP: Any = object()
"""``Plan(data=KEEP)`` (the default): keep the stored data, checked against the target's type."""


class Instance(Generic[D]):
    """What a migration function sees of one in-flight saga of the source version (read-only)."""

    def __init__(self, source: Saga[D], state: SagaState) -> None:
        self._source = source
        self.state = _state_decoder.decode(_json.encode(state))
        """A copy of the saga's full record."""

    @property
    def id(self) -> str:
        """The saga id."""
        return self.state.id

    @property
    def status(self) -> SagaStatus:
        """The saga's lifecycle status."""
        return self.state.status

    @property
    def data(self) -> D:
        """The saga's data, decoded as the source version's data type."""
        return self._source.decode_data(bytes(self.state.data))

    @property
    def current(self) -> str | None:
        """The step the saga is at (``None`` past the last one)."""
        return current_step(self._source, self.state)

    @property
    def completed(self) -> tuple[str, ...]:
        """The steps that succeeded, in the order they did."""
        return tuple(self.state.completed)

    def output(self, step: str | Step[Any, Any]) -> Any:
        """A completed step's output, decoded as the source step's output type."""
        name = step if isinstance(step, str) else step.name
        if name not in self.state.completed:
            raise KeyError(f"step {name!r} of {self.id} has not succeeded")
        return self._source.step_named(name).decode_output(completed_output(self._source, self.state, name))


@dataclass(frozen=True, slots=True)
class Plan:
    """How one instance moves to the target version (what a migration function returns).

    Attributes:
        data: The saga's new data (a value of the target's data type); by default the
            stored data, which must then be valid for the target's data type.
        steps: Source step name -> target step name, for renamed steps; a step not listed
            keeps its name (it must exist in the target if the saga has run it).
        outputs: Target step name -> a replacement output for a completed step (a value
            of the target step's output type), when the recorded one does not fit.
        skip: Target steps before the saga's position that it has not run and never will
            (new steps inserted before where it is).
        reason: Recorded in the saga's history with the migration.

    """

    data: Any = KEEP
    steps: Mapping[str, str] = field(default_factory=dict)
    outputs: Mapping[str, Any] = field(default_factory=dict)
    skip: Sequence[str] = ()
    reason: str = ""


MigrationFunction = Callable[[Instance[Any]], Plan | None]


@dataclass(frozen=True, slots=True)
class Migration:
    """A user-registered migration from ``source`` to ``target`` (a later version of it).

    ``function`` returns a :class:`Plan`, or ``None`` to leave that instance where it is;
    an exception refuses the instance (it is reported and left untouched).
    """

    source: Saga[Any]
    target: Saga[Any]
    function: MigrationFunction

    def __post_init__(self) -> None:
        if self.source.name != self.target.name:
            raise ValueError(f"a migration stays within one saga: {self.source.key} -> {self.target.key}")
        if self.target.version <= self.source.version:
            raise ValueError(f"a migration goes to a later version: {self.source.key} -> {self.target.key}")
        if self.source.context != self.target.context:
            raise ValueError(f"{self.source.key} and {self.target.key} live in different contexts")

    @property
    def name(self) -> str:
        """``name@N->M``."""
        return f"{self.source.key}->{self.target.version}"


def migration(source: Saga[Any], target: Saga[Any]) -> Callable[[MigrationFunction], Migration]:
    """Declare a migration function from ``source`` to ``target``; register it with the App.

    Example::

        @migration(order_v1, order_v2)
        def order_v1_to_v2(instance: Instance[Order]) -> Plan:
            return Plan(steps={"charge_payment": "charge_card"})

        app = App("orders", sagas=[order_v1, order_v2], migrations=[order_v1_to_v2])
    """

    def register(function: MigrationFunction) -> Migration:
        return Migration(source, target, function)

    return register


@dataclass(frozen=True, slots=True)
class MigrationDecision:
    """What a migration decided for one saga: move it (``event`` and the new ``state``), or why not."""

    outcome: Literal["migrate", "refused", "skipped"]
    reason: str = ""
    event: Migrated | None = None
    state: SagaState | None = None


def decide_migration(
    migration: Migration, state: SagaState, *, event_id: str, at_ms: int, by: str
) -> MigrationDecision:
    """Run the user's function for one saga and check its plan; nothing is written here."""
    try:
        plan = migration.function(Instance(migration.source, state))
    except Exception as error:  # noqa: BLE001 - the user's function refuses this saga; report it, go on
        return MigrationDecision("refused", f"the migration function raised {type(error).__name__}: {error}")
    if plan is None:
        return MigrationDecision("skipped", "the migration function left it")
    try:
        event = plan_event(migration, state, plan, event_id=event_id, at_ms=at_ms, by=by)
        new_state = migrate_state(migration.source, migration.target, state, event)
    except MigrationRefused as error:
        return MigrationDecision("refused", str(error))
    return MigrationDecision("migrate", event=event, state=new_state)


def plan_event(
    migration: Migration, state: SagaState, plan: Plan, *, event_id: str, at_ms: int, by: str
) -> Migrated:
    """The :class:`~saga.core.model.Migrated` record of ``plan`` for ``state`` (data and outputs encoded).

    Raises :class:`MigrationRefused` when the plan's data or outputs do not fit the target.
    """
    source, target = migration.source, migration.target
    groups = [name for name, step in state.steps.items() if step.group is not None]
    if groups:  # branch records are keyed by group name and index: not moved between versions
        raise MigrationRefused(
            f"group steps {groups} have started branches; let the saga end on {source.key}"
        )
    unknown = [name for name in plan.steps if name not in state.steps]
    if unknown:
        raise MigrationRefused(f"the plan maps steps {unknown} that {source.key} has no record of")
    mapping = {name: plan.steps.get(name, name) for name in state.steps}
    try:
        data = target.encode_data(plan.data) if plan.data is not KEEP else bytes(state.data)
        outputs = {
            name: msgspec.Raw(_encode_output(target, name, value)) for name, value in plan.outputs.items()
        }
    except (InvalidInput, KeyError) as error:
        raise MigrationRefused(str(error.args[0] if error.args else error)) from error
    return Migrated(
        id=event_id,
        at_ms=at_ms,
        from_version=source.version,
        to_version=target.version,
        steps=mapping,
        data=msgspec.Raw(data),
        outputs=outputs,
        skip=list(plan.skip),
        by=by,
        reason=plan.reason,
    )


def migrate_state(source: Saga[Any], target: Saga[Any], state: SagaState, event: Migrated) -> SagaState:
    """The state ``state`` becomes by ``event``; :class:`MigrationRefused` says why it cannot.

    ``state`` is not modified. The revision is left as it was (the migrate script, and
    replay, count it).
    """
    if (state.name, state.version) != (source.name, source.version):
        raise MigrationRefused(f"saga {state.id} runs {state.name}@{state.version}, not {source.key}")
    if (event.from_version, event.to_version) != (source.version, target.version):
        raise MigrationRefused(f"the record migrates v{event.from_version}->v{event.to_version}")
    if state.status.terminal:
        raise MigrationRefused(f"saga {state.id} has ended ({state.status})")
    problems = _problems(source, target, state, event)
    if problems:
        raise MigrationRefused("; ".join(problems), saga=source.name, version=source.version)
    try:
        target.decode_data(bytes(event.data))
    except msgspec.ValidationError as error:
        raise MigrationRefused(
            f"its data is not a valid {target.data_type.__name__} for {target.key} ({error}): "
            "give Plan(data=...)"
        ) from error
    new = _state_decoder.decode(_json.encode(state))
    new.version = target.version
    new.data = event.data
    kept = {s.name for s in target.steps}
    new.steps = {event.steps[name]: step for name, step in new.steps.items() if event.steps[name] in kept}
    for step in target.steps:
        new.steps.setdefault(step.name, StepState())
    new.completed = [event.steps[name] for name in state.completed]
    new.cursor = _cursor(source, target, state, event)
    for name, output in event.outputs.items():
        new.steps[name].output = output
    for name in new.completed:
        recorded = new.steps[name].output
        try:
            target.step_named(name).decode_output(bytes(recorded))
        except InvalidInput as error:
            raise MigrationRefused(f"{error}: give Plan(outputs={{{name!r}: ...}})") from error
    new.updated_ms = max(state.updated_ms, event.at_ms)
    return new


def _problems(source: Saga[Any], target: Saga[Any], state: SagaState, event: Migrated) -> list[str]:
    problems: list[str] = []
    targets = {s.name: s for s in target.steps}
    mapped = list(event.steps.values())
    if set(event.steps) != set(state.steps):
        problems.append("the record does not map every step the saga has")
    problems.extend(
        f"several steps map to {name!r}" for name in sorted({n for n in mapped if mapped.count(n) > 1})
    )
    for name, step_state in state.steps.items():
        new_name = event.steps.get(name, name)
        ran = bool(step_state.attempts) or name in state.completed
        if new_name not in targets:
            if ran:
                problems.append(f"step {name!r} has run: map it to a step of {target.key}")
            continue
        in_flight = step_state.timer is not None or any(a.outcome is None for a in step_state.attempts)
        if in_flight:
            problems += _in_flight_problems(source.step_named(name), targets[new_name], step_state)
        undo_left = name in state.completed and step_state.status != StepStatus.COMPENSATED
        if undo_left and source.step_named(name).compensation and not targets[new_name].compensation:
            problems.append(
                f"completed step {name!r} must still be undoable, but {new_name!r} has no compensation"
            )
    current = current_step(source, state)
    if current is not None and event.steps.get(current, current) not in targets:
        problems.append(f"the current step {current!r} has no counterpart in {target.key}")
        return problems
    done = {event.steps[name] for name in state.completed}
    for step in target.steps[: _cursor(source, target, state, event)]:
        if step.name not in done and step.name not in event.skip:
            problems.append(
                f"{target.key} step {step.name!r} comes before where the saga is and it has not run: "
                "list it in Plan(skip=...) or map a completed step to it"
            )
    unknown_skip = [name for name in event.skip if name not in targets]
    if unknown_skip:
        problems.append(f"Plan(skip=...) names steps {unknown_skip} that {target.key} does not have")
    return problems


def _in_flight_problems(old: Step[Any, Any], new: Step[Any, Any], step_state: StepState) -> list[str]:
    pending = next((a for a in reversed(step_state.attempts) if a.outcome is None), None)
    what = f"step {old.name!r} has an attempt or a timer in flight"
    if old.name != new.name:
        return [
            f"{what}, and replies and timers find it by name: keep its name, or migrate it when it settles"
        ]
    old_shape, new_shape = step_shape(old), step_shape(new)
    if pending is not None and pending.kind == "undo":
        old_kind = old_shape.compensation.kind if old_shape.compensation else ""
        new_kind = new_shape.compensation.kind if new_shape.compensation else ""
    else:
        old_kind, new_kind = old_shape.kind, new_shape.kind
    if old_kind != new_kind:
        return [f"{what}, and its kind changed ({old_kind} -> {new_kind}): migrate it when it settles"]
    if pending is not None and old_kind == "action":
        return [f"{what}: a local action runs on its own version; migrate it when it settles"]
    return []


def _cursor(source: Saga[Any], target: Saga[Any], state: SagaState, event: Migrated) -> int:
    current = current_step(source, state)
    if current is None:
        return len(target.steps)
    new_name = event.steps.get(current, current)
    names = [s.name for s in target.steps]
    return names.index(new_name) if new_name in names else len(names)


def current_step(definition: Saga[Any], state: SagaState) -> str | None:
    """The step a saga is at, or ``None`` past the last step it has (see the decider)."""
    if state.cursor >= len(definition.steps):
        return None
    name = definition.steps[state.cursor].name
    return name if name in state.steps else None


def _encode_output(target: Saga[Any], name: str, value: Any) -> bytes:
    step = target.step_named(name)
    raw = _json.encode(value)
    step.decode_output(raw)
    return raw
