"""The decider's working copy shares nothing mutable with the state it was made from.

``SagaState.working_copy`` and ``StepState.copy`` copy the model's mutable parts by hand
(a JSON round trip cost twice as much per decision). These tests keep the hand-written copy
honest: a fully populated state (every field away from its default, so that a new field
fails here until the fixture sets it) is copied and walked, object by object; and across
the property tests' worlds, no decision changes the state it was given.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import saga.testing.runner_sagas as runner_module
from saga import SagaState, SagaStatus, StepStatus
from saga.core.model import Attempt, GroupState, Note, ParentLink, StepState, Wait
from tests.saga import test_compose_properties as compose_properties
from tests.saga import test_properties as properties
from tests.saga.purity import leaves_input_alone


def attempt(n: int) -> Attempt:
    return Attempt(
        n=n,
        kind="do",
        command_id=f"c{n}",
        participant="payments",
        input_type="Charge",
        input=msgspec.Raw(b'{"amount":1}'),
        dispatched_ms=10,
        ended_ms=20,
        outcome="ok",
        output=msgspec.Raw(b'{"ok":true}'),
        error="boom",
        worker="w1",
    )


def step_record() -> StepState:
    return StepState(
        status=StepStatus.SUCCEEDED,
        attempts=[attempt(1), attempt(2)],
        output=msgspec.Raw(b'{"ok":true}'),
        timer="t1",
        generation=1,
        group=GroupState(
            total=3, started=2, running=[1], succeeded=1, failed=1, completions=1, closed="x", winner=0
        ),
        seq=2,
        rewait=1,
    )


def note(what: str) -> Note:
    return Note(at_ms=5, what=what, by="operator", reason="why", step="charge")


def full_state() -> SagaState:
    return SagaState(
        id="s1",
        name="order",
        version=2,
        context="orders",
        partition=1,
        status=SagaStatus.COMPENSATING,
        data=msgspec.Raw(b'{"id":1}'),
        steps={"charge": step_record(), "ship": step_record()},
        cursor=1,
        completed=["charge"],
        cancel=note("cancel"),
        error=note("error"),
        revision=7,
        created_ms=1,
        updated_ms=2,
        wait=Wait(step="ship", kind="event", n=1, since_ms=3, stream="s", message_type="Shipped", key="k"),
        expired=note("expired"),
        signals={"ship:1": msgspec.Raw(b"1")},
        branches={"fan#0": step_record()},
        parent=ParentLink(
            context="billing",
            partition=0,
            saga_id="p1",
            saga="bill@1",
            step="child",
            attempt=1,
            command_id="c9",
            incarnation=1700000000000,
        ),
        trace="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        trace_state="vendor=1",
        stamped=True,
    )


def assert_every_field_set(value: msgspec.Struct) -> None:
    """Every field of ``value`` and of the Structs inside it differs from its default."""
    for info in msgspec.structs.fields(value):
        field_value = getattr(value, info.name)
        default = info.default_factory() if info.default_factory is not msgspec.NODEFAULT else info.default
        assert field_value != default, f"{type(value).__name__}.{info.name} is left at its default"
        for inner in _children(field_value):
            if isinstance(inner, msgspec.Struct):
                assert_every_field_set(inner)


def _children(value: Any) -> list[Any]:
    if isinstance(value, msgspec.Struct):
        return [getattr(value, info.name) for info in msgspec.structs.fields(value)]
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list):
        return list(value)
    return []


def mutable_objects(value: Any, *, skip: frozenset[int] = frozenset()) -> dict[int, str]:
    """id -> path of every mutable object reachable from ``value`` (not below ``skip``)."""
    found: dict[int, str] = {}

    def walk(item: Any, path: str) -> None:
        if id(item) in skip:
            return
        frozen = isinstance(item, msgspec.Struct) and item.__struct_config__.frozen
        if isinstance(item, msgspec.Struct | dict | list) and not frozen:
            found[id(item)] = path
        if isinstance(item, msgspec.Struct):
            for info in msgspec.structs.fields(item):
                walk(getattr(item, info.name), f"{path}.{info.name}")
        elif isinstance(item, dict):
            for key, inner in item.items():
                walk(inner, f"{path}[{key!r}]")
        elif isinstance(item, list):
            for index, inner in enumerate(item):
                walk(inner, f"{path}[{index}]")

    walk(value, "state")
    return found


def test_the_fixture_sets_every_field_so_a_new_one_is_noticed() -> None:
    assert_every_field_set(full_state())


def test_a_working_copy_is_equal_and_shares_nothing_mutable_but_step_and_branch_records() -> None:
    state = full_state()
    copy = state.working_copy()

    assert copy == state
    records = frozenset(id(record) for record in [*state.steps.values(), *state.branches.values()])
    shared = set(mutable_objects(copy, skip=records)) & set(mutable_objects(state))
    paths = mutable_objects(copy)
    assert not shared, f"shared with the original: {sorted(paths[i] for i in shared)}"
    assert copy.steps is not state.steps
    assert copy.branches is not state.branches
    assert all(copy.steps[k] is state.steps[k] for k in state.steps)  # copied on write
    assert all(copy.branches[k] is state.branches[k] for k in state.branches)


def test_a_step_copy_is_equal_and_shares_nothing_mutable() -> None:
    record = step_record()
    copy = record.copy()

    assert copy == record
    assert not set(mutable_objects(copy)) & set(mutable_objects(record))


def test_the_check_catches_a_copy_that_shares_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    def shallow(self: StepState) -> StepState:
        return msgspec.structs.replace(self)

    monkeypatch.setattr(StepState, "copy", shallow)
    with pytest.raises(AssertionError, match="attempts"):
        test_a_step_copy_is_equal_and_shares_nothing_mutable()


@pytest.fixture
def decisions_leave_their_input_alone(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wrap the runner's decider: every call must leave the state it was given unchanged."""
    calls = [0]
    monkeypatch.setattr(runner_module, "decide", leaves_input_alone(runner_module.decide, calls))
    return calls


@pytest.mark.parametrize("suite", [properties, compose_properties], ids=["steps", "groups"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_decision_changes_the_state_or_branches_it_is_given(
    suite: Any, data: st.DataObject, decisions_leave_their_input_alone: list[int]
) -> None:
    suite.play(data.draw(suite.worlds()))
    assert decisions_leave_their_input_alone[0] > 0
