"""The compatibility rules on shapes: each breaking change is detected, each safe one passes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from saga import Context, Retry
from saga.definition.shape import Shape, StepShape, decode_shape, encode_shape, shape_of
from saga.versions.compatibility import compare_shapes
from saga.versions.records import ContextSnapshot, RegistrySnapshot, check_registry
from saga.versions.rules import RULES as COMPATIBILITY_RULES
from tests.saga.versioned import CONTEXT, STEPS, V1, build

REGISTERED = shape_of(V1)


def changes_to(definition: Any, registered: Shape = REGISTERED) -> list[tuple[str, bool, str]]:
    return [(c.rule, c.breaking, c.line()) for c in compare_shapes(registered, shape_of(definition))]


class OrderWithoutTotal(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    note: str = ""


class OrderTotalAsText(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    total: str
    note: str = ""


class OrderNeedsCurrency(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    total: int
    currency: str
    note: str = ""


class OrderNoteRequired(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    total: int
    note: str


class OrderWithCurrency(msgspec.Struct, frozen=True, kw_only=True):
    """A new docstring changes nothing either."""

    id: str
    total: int
    note: str = ""
    currency: str = "EUR"


class OrderWidened(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    total: float | None
    note: str = ""


class ReservedRenamed(msgspec.Struct, tag="StockHeld", frozen=True, kw_only=True):
    reservation: str


class ChargedWithoutId(msgspec.Struct, tag="Charged", frozen=True, kw_only=True):
    amount: int = 0


BREAKING = {
    "step removed": (build(steps=("reserve", "ship")), "step-removed", "step 'charge' was removed"),
    "step renamed": (
        build(steps=("reserve", "pay", "ship"), undo={"reserve": "release"}),
        "step-renamed",
        "step 'charge' was renamed to 'pay'",
    ),
    "steps reordered": (build(steps=("charge", "reserve", "ship")), "step-reordered", "were reordered"),
    "step inserted": (
        build(steps=("reserve", "fraud_check", "charge", "ship")),
        "step-inserted",
        "step 'fraud_check' was inserted before existing steps",
    ),
    "step kind changed": (build(actions=("charge",)), "step-kind-changed", "from command to action"),
    "compensation removed": (
        build(undo={"reserve": "release"}),
        "compensation-removed",
        "step 'charge' lost its compensation 'refund'",
    ),
    "compensation kind changed": (
        build(local_undo=("charge",)),
        "compensation-kind-changed",
        "the compensation of step 'charge' changed kind from command to action",
    ),
    "data field removed": (build(data=OrderWithoutTotal), "field-removed", "data field 'total' was removed"),
    "data field retyped": (
        build(data=OrderTotalAsText),
        "field-retyped",
        "data field 'total' retyped (integer -> string)",
    ),
    "data field added without a default": (
        build(data=OrderNeedsCurrency),
        "field-required",
        "data field 'currency' was added without a default",
    ),
    "data field made required": (
        build(data=OrderNoteRequired),
        "field-required",
        "data field 'note' is now required",
    ),
    "reply type renamed": (
        build(replies={"reserve": ReservedRenamed}),
        "reply-type-renamed",
        "the reply type of step 'reserve' changed from Reserved to StockHeld",
    ),
    "output field removed": (
        build(replies={"charge": ChargedWithoutId}),
        "field-removed",
        "charge output field 'charge' was removed",
    ),
    "context changed": (build(context=Context("elsewhere")), "context-changed", "context changed"),
    "partitions changed": (build(context=Context("shop", partitions=4)), "partitions-changed", "from 1 to 4"),
}


@pytest.mark.parametrize("case", list(BREAKING))
def test_each_breaking_change_is_detected_and_says_make_a_new_version(case: str) -> None:
    definition, rule, text = BREAKING[case]
    found = changes_to(definition)
    breaking = [(r, line) for r, is_breaking, line in found if is_breaking]
    assert rule in [r for r, _ in breaking], found
    line = next(line for r, line in breaking if r == rule)
    assert line.startswith("shop_order@1: ")
    assert text in line
    if rule != "partitions-changed":
        assert line.endswith(": make this version 2")
    else:
        assert "keep 1 partitions" in line


SAFE = {
    "step appended": (build(steps=(*STEPS, "notify")), ["step-appended"]),
    "compensation added": (
        build(undo={"reserve": "release", "charge": "refund", "ship": "recall"}, local_undo=("ship",)),
        ["compensation-added"],
    ),
    "field added with a default": (build(data=OrderWithCurrency), ["field-added"]),
    "field widened": (build(data=OrderWidened), []),
    "nothing but retries and docs": (V1, []),
}


@pytest.mark.parametrize("case", list(SAFE))
def test_each_safe_change_passes(case: str) -> None:
    definition, rules = SAFE[case]
    found = changes_to(definition)
    assert not [line for _, breaking, line in found if breaking], found
    assert [rule for rule, _, _ in found] == rules


def test_a_compensation_for_a_step_that_had_none_is_a_safe_new_path() -> None:
    registered = shape_of(build(undo={"reserve": "release"}))
    found = changes_to(build(), registered)
    assert [(rule, breaking) for rule, breaking, _ in found] == [("compensation-added", False)]


def test_retry_policies_timeouts_and_docstrings_are_not_part_of_a_shape() -> None:
    other = build()
    for step in other.steps:
        object.__setattr__(step, "retry", Retry(attempts=9))
        object.__setattr__(step, "timeout_s", 3.0)
    assert shape_of(other) == REGISTERED
    assert shape_of(other).fingerprint == REGISTERED.fingerprint


def _with_step(shape: Shape, index: int, **changes: Any) -> Shape:
    steps = list(shape.steps)
    steps[index] = msgspec.structs.replace(steps[index], **changes)
    return msgspec.structs.replace(shape, steps=tuple(steps))


def test_waits_and_branches_compare_generically_for_new_step_kinds() -> None:
    """Sleep, signal and event waits and branches need no new rules."""
    waiting = _with_step(REGISTERED, 2, kind="wait_signal", waits=("approved",))
    more_paths = _with_step(waiting, 2, waits=("approved", "rejected"))
    assert [(c.rule, c.breaking) for c in compare_shapes(waiting, more_paths)] == [("wait-added", False)]
    fewer_paths = _with_step(waiting, 2, waits=())
    assert [(c.rule, c.breaking) for c in compare_shapes(waiting, fewer_paths)] == [("wait-removed", True)]

    branch = (StepShape(name="a", kind="command"), StepShape(name="b", kind="command"))
    grouped = _with_step(REGISTERED, 2, kind="parallel", branches={"left": branch})
    widened = _with_step(
        grouped, 2, branches={"left": (*branch, StepShape(name="c", kind="command")), "right": ()}
    )
    assert sorted((c.rule, c.breaking) for c in compare_shapes(grouped, widened)) == [
        ("branch-added", False),
        ("step-appended", False),
    ]
    shrunk = _with_step(grouped, 2, branches={"left": branch[1:]})
    [removed] = compare_shapes(grouped, shrunk)
    assert removed.rule == "step-removed"
    assert "in branch 'left' of 'ship'" in removed.detail
    assert [c.rule for c in compare_shapes(grouped, _with_step(grouped, 2, branches={}))] == [
        "branch-removed"
    ]


def test_a_step_kind_can_describe_its_own_shape() -> None:
    definition = build()

    class Custom:
        def shape(self) -> StepShape:
            return StepShape(name="ship", kind="sleep", waits=("timer",))

    from saga.definition.shape import step_shape

    assert step_shape(Custom()).kind == "sleep"
    assert step_shape(definition.steps[0]).kind == "command"


def test_the_suggested_version_skips_versions_already_taken() -> None:
    broken = build(steps=("reserve", "ship"))
    snapshot = RegistrySnapshot(
        taken_ms=0,
        contexts={"shop": ContextSnapshot(partitions=1, shapes={"shop_order@1": REGISTERED})},
    )
    v2 = build(version=2)
    v3 = build(version=3)
    [problem] = [c for c in check_registry(snapshot, [broken, v2, v3]) if c.breaking]
    assert problem.line() == "shop_order@1: step 'charge' was removed: make this version 4"


def test_a_dropped_version_with_sagas_in_flight_is_a_problem() -> None:
    snapshot = RegistrySnapshot(
        taken_ms=0,
        contexts={
            "shop": ContextSnapshot(
                partitions=1,
                shapes={"shop_order@1": REGISTERED, "shop_order@2": shape_of(build(version=2))},
                in_flight={"shop_order@1": 3},
            )
        },
    )
    [dropped] = check_registry(snapshot, [build(version=2)])
    assert dropped.rule == "version-dropped"
    assert dropped.line() == (
        "shop_order@1: 3 sagas are in flight on it and the code no longer defines it: keep it until they "
        "end (drain it, then decommission it), or migrate them"
    )
    snapshot.contexts["shop"].in_flight = {}
    assert check_registry(snapshot, [build(version=2)]) == []


def test_shapes_round_trip_and_a_newer_format_is_refused() -> None:
    assert decode_shape(encode_shape(REGISTERED)) == REGISTERED
    newer = msgspec.structs.replace(REGISTERED, format=99)
    with pytest.raises(ValueError, match="format 99"):
        decode_shape(encode_shape(newer))


def test_shapes_record_schemas_without_documentation() -> None:
    schema = REGISTERED.data.schema
    assert "description" not in str(schema)
    assert REGISTERED.steps[0].output is not None
    assert REGISTERED.steps[0].output.name == "Reserved"
    assert REGISTERED.context == CONTEXT.name
    assert shape_of(build(data=OrderWithCurrency)).data.schema != schema


def test_every_rule_is_documented_with_a_reason() -> None:
    assert all(rule.why for rule in COMPATIBILITY_RULES.values())
    assert {r for r, rule in COMPATIBILITY_RULES.items() if not rule.breaking} == {
        "step-appended",
        "compensation-added",
        "wait-added",
        "branch-added",
        "field-added",
    }
