"""One error tree per package: every exception class a package defines is in it.

The saga engine's errors are all in ``saga.errors`` (``saga/errors/``) and drawn in its docstring
(the drawing is checked against the classes, parent by parent); the bus's are under
:class:`bus.BusError` and the relay's under :class:`relay.RelayError`. The errors that
carry new fields are checked where they are raised.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import msgspec
import pytest

import bus
import relay
import saga
from saga import Command, Saga, SagaStatus, command
from saga.definition.schedule import Schedule
from saga.errors import (
    CalendarError,
    CronError,
    InvalidSchedule,
    InvalidToken,
    RunnerError,
    SagaError,
    TooManyItems,
)
from saga.testing import FakeParticipant, SagaRunner


def modules_of(package: ModuleType) -> list[ModuleType]:
    names = [info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return [package, *(importlib.import_module(name) for name in names)]


def exceptions_defined_in(package: ModuleType) -> list[type[BaseException]]:
    """Every exception class whose home is a module of ``package`` (private ones too)."""
    found: dict[str, type[BaseException]] = {}
    for module in modules_of(package):
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.split(".")[0] == package.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def test_every_error_the_saga_engine_defines_is_in_saga_errors() -> None:
    errors = exceptions_defined_in(saga)
    assert len(errors) > 20
    assert sorted(f"{e.__module__}.{e.__qualname__}" for e in errors if e.__module__ != "saga.errors") == []
    assert [e.__name__ for e in errors if not issubclass(e, SagaError)] == []


def drawn_tree() -> dict[str, str]:
    """``{class name: the parent drawn above it}`` from the docstring of ``saga.errors``."""
    parents: dict[str, str] = {}
    path: list[str] = []
    for line in (saga.errors.__doc__ or "").splitlines():
        found = re.match(r"^    (?P<indent>(?:[│ ]   )*)(?:[├└]── )?(?P<name>[A-Z]\w+)", line)
        if not found:
            continue
        depth = len(found["indent"]) // 4 + (1 if "──" in line else 0)
        path[depth:] = [found["name"]]
        if depth:
            parents[found["name"]] = path[depth - 1]
    return parents


def test_the_drawing_of_the_tree_is_the_tree() -> None:
    classes = {
        name: value
        for name, value in vars(saga.errors).items()
        if inspect.isclass(value) and issubclass(value, SagaError)
    }
    drawn = drawn_tree()
    assert set(drawn) == set(classes) - {"SagaError"}
    assert {name: classes[name].__mro__[1].__name__ for name in drawn} == drawn
    assert set(saga.errors.__all__) == set(classes)


def test_the_mixins_keep_what_users_caught_before() -> None:
    """A schedule's mistakes and a map's refused items were ValueErrors; a replay's, assertions."""
    for error in (InvalidSchedule, CronError, CalendarError, TooManyItems):
        assert issubclass(error, ValueError), error
    for error in (saga.errors.ReplayMismatch, saga.errors.TraceMismatch):
        assert issubclass(error, AssertionError), error


@pytest.mark.parametrize(
    ("package", "base"), [(bus, bus.BusError), (relay, relay.RelayError)], ids=["bus", "relay"]
)
def test_every_error_of_the_bus_and_the_relay_is_in_its_tree(package: ModuleType, base: type) -> None:
    errors = exceptions_defined_in(package)
    assert errors
    assert [f"{e.__module__}.{e.__qualname__}" for e in errors if not issubclass(e, base)] == []


# -- the fields -------------------------------------------------------------------------------


class Data(msgspec.Struct, frozen=True):
    items: list[int] = msgspec.field(default_factory=list)


class Ping(msgspec.Struct, tag=True, frozen=True):
    n: int = 0


class Pong(msgspec.Struct, tag=True, frozen=True):
    n: int = 0


def mapped(limit: int) -> Saga[Data]:
    definition: Saga[Data] = Saga("limited_map", context="errors", data=Data)

    @definition.map(items=lambda d: d.items, reply=Pong, limit=limit, name="m")
    def each(_data: Data, n: int) -> Command:
        return command("p", Ping(n=n))

    return definition


def test_a_map_over_its_limit_raises_too_many_items_with_the_count_and_the_limit() -> None:
    group = mapped(limit=2).step_named("m").group
    assert group is not None
    with pytest.raises(TooManyItems) as refused:
        group.items_of(Data(items=[1, 2, 3]))
    assert (refused.value.count, refused.value.limit) == (3, 2)
    assert str(refused.value) == "3 items, over the map's limit of 2"


def test_a_map_over_its_limit_fails_its_step_with_the_errors_message_as_the_reason() -> None:
    runner = SagaRunner(mapped(limit=2), participants=[FakeParticipant("p", {Ping: Pong()})])
    state = runner.run(Data(items=[1, 2, 3]))
    assert state.status == SagaStatus.FAILED
    assert state.error is not None
    assert (state.error.what, state.error.step) == ("group refused", "m")
    assert state.error.reason == "3 items, over the map's limit of 2"  # not "items() raised ..."
    assert runner.calls == []


def schedule(**changes: object) -> Schedule:
    fields: dict[str, object] = {"id": "nightly", "saga": "report", "context": "c", "cron": "0 2 * * *"}
    return Schedule(**(fields | changes))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"id": "has space"}, "an id is 1-128 characters, no spaces, braces or '@'"),
        ({"cron": "", "start_at_ms": None}, "give a cron expression, a start time, or both"),
        (
            {"timezone": "Mars/Olympus"},
            "unknown time zone 'Mars/Olympus' (an IANA name such as Europe/Berlin)",
        ),
        ({"catch_up_window_ms": -1}, "catch_up_window_ms must be >= 0"),
    ],
)
def test_a_wrong_schedule_says_which_and_why(bad: dict[str, object], reason: str) -> None:
    with pytest.raises(InvalidSchedule) as refused:
        schedule(**bad)
    assert refused.value.reason == reason
    assert refused.value.schedule_id == bad.get("id", "nightly")
    assert str(refused.value) == f"schedule {refused.value.schedule_id!r}: {reason}"


def test_a_holiday_that_is_no_date_names_the_schedule() -> None:
    with pytest.raises(InvalidSchedule, match=r"holiday '25/12/2026' is no YYYY-MM-DD date") as refused:
        schedule(holidays=("25/12/2026",))
    assert refused.value.schedule_id == "nightly"


def test_a_wrong_cron_expression_is_a_wrong_schedule_and_names_its_field() -> None:
    with pytest.raises(InvalidSchedule) as refused:
        schedule(cron="61 * * * *")
    assert isinstance(refused.value, CronError)
    assert (refused.value.expression, refused.value.field) == ("61 * * * *", "minute")


def test_a_runner_missing_a_participant_names_it() -> None:
    definition: Saga[Data] = Saga("unserved", context="errors", data=Data)

    @definition.step(reply=Pong)
    def ask(_data: Data) -> Command:
        return command("nobody", Ping())

    runner = SagaRunner(definition, participants=[FakeParticipant("p", {Ping: Pong()})])
    with pytest.raises(RunnerError) as refused:
        runner.run(Data())
    assert refused.value.participant == "nobody"
    assert "give the runner its fake" in str(refused.value)


def test_a_malformed_token_has_no_saga_and_a_forged_one_names_its_saga_and_step() -> None:
    from saga.core.tokens import Signer

    signer = Signer.from_secret(b"k" * 32, "errors")
    with pytest.raises(InvalidToken) as malformed:
        signer.verify("not a token")
    assert (malformed.value.saga, malformed.value.step) == ("", "")
    assert malformed.value.reason == str(malformed.value)
    token = signer.token(0, "s-1", "approve", 1, incarnation=1, now_ms=0)
    other = Signer.from_secret(b"o" * 32, "errors")
    with pytest.raises(InvalidToken) as forged:
        other.verify(token)
    assert (forged.value.saga, forged.value.step) == ("s-1", "approve")
