"""A definition finds its steps by name through an index that follows its declarations."""

from __future__ import annotations

import msgspec
import pytest

from saga import Command, Saga, command


class Data(msgspec.Struct, frozen=True):
    id: str


class Done(msgspec.Struct, frozen=True):
    pass


def work(data: Data) -> Command:
    return command("worker", Done())


def test_a_step_and_a_branch_declared_after_the_first_lookup_are_found() -> None:
    saga: Saga[Data] = Saga("indexed", context="index-tests", data=Data)
    saga.step(reply=Done)(work)
    assert saga.step_named("work").name == "work"
    assert not saga.takes_signals

    group = saga.parallel("both")
    assert saga.step_named("both").group is not None

    def flight(data: Data) -> Command:
        return command("worker", Done())

    group.step(reply=Done)(flight)  # a branch added to a group the index has already seen
    assert saga.step_named("flight").name == "flight"
    assert saga.step_named("both#0").name == "flight"

    saga.wait_signal("approved")
    assert saga.takes_signals


def test_an_unknown_name_is_a_key_error_naming_the_saga() -> None:
    saga: Saga[Data] = Saga("indexed", context="index-tests", data=Data)
    saga.step(reply=Done)(work)
    with pytest.raises(KeyError, match="indexed@1 has no step 'nope'"):
        saga.step_named("nope")
