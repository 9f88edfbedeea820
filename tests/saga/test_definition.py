"""The definition API fails fast: every mistake is a DefinitionError naming the saga and the step.

Decorators check what they can when applied (names, signatures, sync vs async, types);
``Saga.validate`` -- run by ``App``, ``Registry`` and ``SagaRunner`` -- checks what needs the
whole definition (compensation targets, unused compensations, no steps).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from saga import (
    App,
    Command,
    Context,
    DefinitionError,
    Participant,
    Registry,
    Retry,
    Saga,
    StepContext,
    command,
)
from saga.errors import UnknownDefinition
from saga.testing import SagaRunner
from tests.saga import compose_sagas as sagas


class Data(msgspec.Struct):
    n: int = 0


class Ping(msgspec.Struct, tag=True):
    n: int = 0


class Pong(msgspec.Struct, tag=True):
    n: int = 0


def ping(_data: Data) -> Command:
    return command("pinger", Ping())


def fresh(name: str = "orders_x") -> Saga[Data]:
    return Saga(name, data=Data, context="tests")


def raises(match: str) -> Any:
    return pytest.raises(DefinitionError, match=match)


# -- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "has space", "1starts_with_digit", "at@sign", "x" * 65, "semi;colon"])
def test_bad_saga_names_are_refused(name: str) -> None:
    with raises("invalid saga name"):
        Saga(name, data=Data)


@pytest.mark.parametrize("name", ["has space", "colon:in", "x" * 65])
def test_bad_step_names_name_the_saga_and_the_step(name: str) -> None:
    saga = fresh("naming")
    with raises(r"naming\..*invalid name"):
        saga.step(reply=Pong, name=name)(ping)


def test_a_lambda_step_has_no_usable_name() -> None:
    saga = fresh("lambdas")
    with raises(r"lambdas\.<lambda>: invalid name"):
        saga.step(reply=Pong)(lambda data: command("pinger", Ping()))


def test_bad_compensation_names_are_refused() -> None:
    saga = fresh("comp_names")
    with raises(r"comp_names\.bad name: invalid name"):
        saga.compensation("bad name")(ping)


@pytest.mark.parametrize("participant", ["_local", "has space", ""])
def test_bad_participant_names_are_refused(participant: str) -> None:
    with raises("invalid participant name"):
        command(participant, Ping())


def test_a_command_message_must_be_a_struct() -> None:
    with raises("must be a msgspec Struct"):
        command("pinger", {"n": 1})


@pytest.mark.parametrize("version", [0, -1])
def test_versions_are_positive(version: int) -> None:
    with raises(r"saga 'versions': version must be a positive integer"):
        Saga("versions", data=Data, version=version)


@pytest.mark.parametrize("partitions", [0, 1025])
def test_context_partitions_are_bounded(partitions: int) -> None:
    from saga import Context

    with raises("partitions must be between 1 and 1024"):
        Context("ctx", partitions=partitions)


# -- duplicates ------------------------------------------------------------------------------


def test_duplicate_step_names_are_refused() -> None:
    saga = fresh("dupes")
    saga.step(reply=Pong)(ping)
    with raises(r"dupes\.ping: a step with this name is already declared"):
        saga.step(reply=Pong)(ping)


def test_a_step_and_an_action_cannot_share_a_name() -> None:
    saga = fresh("dupes_mixed")
    saga.step(reply=Pong, name="work")(ping)

    async def work(_data: Data) -> int:
        return 1

    with raises(r"dupes_mixed\.work: a step with this name is already declared"):
        saga.action()(work)


def test_duplicate_compensation_names_are_refused() -> None:
    saga = fresh("dupe_comps")
    saga.compensation("undo")(ping)
    with raises(r"dupe_comps\.undo: a compensation with this name is already declared") as caught:
        saga.compensation("undo")(ping)
    assert (caught.value.saga, caught.value.step) == ("dupe_comps", "undo")


def test_a_participant_handles_each_command_type_once() -> None:
    participant = Participant("pinger", serves=["tests"])

    async def handle(_command: Ping, _ctx: Any) -> Pong:
        return Pong()

    participant.handles(Ping)(handle)
    with pytest.raises(DefinitionError, match="'pinger' already handles Ping"):
        participant.handles(Ping)(handle)


# -- whole-definition checks ------------------------------------------------------------------


def validators() -> list[Callable[[Saga[Data]], object]]:
    return [
        lambda saga: saga.validate(),
        lambda saga: Registry([saga]),
        lambda saga: App("app", sagas=[saga]),
        SagaRunner,
    ]


@pytest.mark.parametrize("validate", validators(), ids=["validate", "Registry", "App", "SagaRunner"])
def test_a_missing_compensation_target_is_refused(validate: Callable[[Saga[Data]], object]) -> None:
    saga = fresh("missing_comp")
    saga.step(reply=Pong, compensate="unping")(ping)
    with raises(r"missing_comp\.ping: compensate='unping' names no declared compensation"):
        validate(saga)


@pytest.mark.parametrize("validate", validators(), ids=["validate", "Registry", "App", "SagaRunner"])
def test_an_unused_compensation_is_refused(validate: Callable[[Saga[Data]], object]) -> None:
    saga = fresh("unused_comp")
    saga.step(reply=Pong)(ping)
    saga.compensation("unping")(ping)
    with raises(r"saga 'unused_comp': compensations unping undo no step"):
        validate(saga)


def test_a_misspelt_compensation_lists_the_declared_ones() -> None:
    saga = fresh("typo")
    saga.step(reply=Pong, compensate="unpign")(ping)
    saga.compensation("unping")(ping)
    with raises(r"typo\.ping: compensate='unpign' names no declared compensation \(declared: unping\)"):
        saga.validate()


def test_a_saga_needs_steps() -> None:
    with raises("saga 'empty': has no steps") as caught:
        fresh("empty").validate()
    assert (caught.value.saga, caught.value.step) == ("empty", "")


def test_two_definitions_of_one_version_are_refused() -> None:
    first, second = fresh("twice"), fresh("twice")
    first.step(reply=Pong)(ping)
    second.step(reply=Pong)(ping)
    with raises("two definitions of twice@1"):
        Registry([first, second])


def test_one_context_declared_with_two_partition_counts_is_refused() -> None:
    one, two = (
        Saga("one_p", data=Data, context="split"),
        Saga("two_p", data=Data, context=Context("split", 2)),
    )
    for saga in (one, two):
        saga.step(reply=Pong)(ping)
    with raises("context 'split' is declared with 1 and 2 partitions"):
        Registry([one, two])


def test_a_registry_names_what_it_does_not_hold() -> None:
    saga = fresh("held")
    saga.step(reply=Pong)(ping)
    other = Saga("elsewhere", data=Data, context="other")
    other.step(reply=Pong)(ping)
    registry = Registry([saga, other])
    with pytest.raises(UnknownDefinition, match="no definition held@2 is registered here"):
        registry.get("held", 2)
    with pytest.raises(UnknownDefinition, match="no definition named 'nope' is registered here"):
        registry.latest("nope")
    with pytest.raises(UnknownDefinition, match=r"name a context: this registry has other, tests"):
        registry.context(None)
    with pytest.raises(UnknownDefinition, match="no context 'nope' here"):
        registry.context("nope")
    assert registry.context("tests").name == "tests"


def test_an_app_refuses_to_run_nothing() -> None:
    with pytest.raises(ValueError, match="app 'idle' runs nothing: give it sagas, participants or buses"):
        App("idle")


def test_a_valid_definition_passes() -> None:
    saga = fresh("valid")
    saga.step(reply=Pong, compensate="unping", retry=Retry(attempts=2), timeout=timedelta(seconds=5))(ping)
    saga.compensation("unping")(ping)

    async def local(_data: Data, ctx: StepContext) -> Pong:
        return Pong(n=ctx.attempt)

    saga.action()(local)
    saga.validate()
    assert [s.name for s in saga.steps] == ["ping", "local"]
    assert saga.steps[0].timeout_s == 5.0
    assert saga.steps[1].local
    assert saga.steps[1].output_type is Pong


# -- signatures ------------------------------------------------------------------------------


def test_a_command_step_builder_must_not_be_async() -> None:
    saga = fresh("async_builder")

    async def charge(_data: Data) -> Command:
        return command("pinger", Ping())

    with raises(r"async_builder\.charge: a command step's builder must be a plain function") as caught:
        saga.step(reply=Pong)(charge)
    assert (caught.value.saga, caught.value.step) == ("async_builder", "charge")
    assert caught.value.reason.startswith("a command step's builder must be a plain function")


def test_a_group_declares_its_branches_as_a_saga_declares_its_steps() -> None:
    # One decorator core: the same checks, the same errors, the same output types.
    saga, group = fresh("branches"), fresh("branches").parallel("both")

    async def charge(_data: Data) -> Command:
        return command("pinger", Ping())

    def local(_data: Data) -> Pong:
        return Pong()

    async def act(_data: Data) -> Pong:
        return Pong()

    for declare_step, declare_action in ((saga.step, saga.action), (group.step, group.action)):
        with raises("a command step's builder must be a plain function") as not_plain:
            declare_step(reply=Pong)(charge)
        with raises("an action must be an 'async def' function") as not_async:
            declare_action()(local)
        assert [(e.value.saga, e.value.step) for e in (not_plain, not_async)] == [
            ("branches", "charge"),
            ("branches", "local"),
        ]
        assert declare_action()(act).output_type is Pong


def test_an_action_must_be_async() -> None:
    saga = fresh("sync_action")

    def local(_data: Data) -> Pong:
        return Pong()

    with raises(r"sync_action\.local: an action must be an 'async def' function"):
        saga.action()(local)


def test_an_action_declares_its_output_type() -> None:
    saga = fresh("no_annotation")

    async def local(_data: Data):  # type: ignore[no-untyped-def]
        return Pong()

    with raises(r"no_annotation\.local: annotate the action's return type"):
        saga.action()(local)


def test_an_unresolvable_return_annotation_is_refused() -> None:
    saga = fresh("unresolvable")

    async def local(_data: Data) -> NoSuchType:  # type: ignore[name-defined]  # noqa: F821
        return Pong()

    with raises(r"unresolvable\.local: cannot resolve the return annotation"):
        saga.action()(local)


def test_an_action_returning_none_has_no_output() -> None:
    saga = fresh("returns_none")

    async def local(_data: Data) -> None:
        return None

    assert saga.action()(local).output_type is None


def test_an_unencodable_output_type_is_refused() -> None:
    saga = fresh("unencodable")

    async def local(_data: Data) -> int | list[int] | tuple[int, ...]:  # two array-likes: ambiguous
        return 1

    with raises(r"unencodable\.local: output type .* is not msgspec-encodable"):
        saga.action()(local)


@pytest.mark.parametrize(
    "builder",
    [
        lambda: None,
        lambda data, ctx, extra: None,
        lambda *args: None,
    ],
    ids=["no arguments", "three arguments", "only *args"],
)
def test_a_builder_takes_data_or_data_and_context(builder: Callable[..., Any]) -> None:
    saga = fresh("signatures")
    with raises(r"signatures\.build: takes \(data\) or \(data, ctx\), not \d arguments"):
        saga.step(reply=Pong, name="build")(builder)


def test_optional_parameters_do_not_count() -> None:
    saga = fresh("optional")

    def build(data: Data, ctx: StepContext | None = None, *, extra: int = 0) -> Command:
        return command("pinger", Ping())

    assert saga.step(reply=Pong)(build).takes_context is False


def test_a_required_keyword_only_parameter_is_refused() -> None:
    # The engine calls builders as fn(data) or fn(data, ctx): a required keyword-only
    # parameter could never be given, and the step would fail at run time instead.
    saga = fresh("kw_only")

    def build(data: Data, *, region: str) -> Command:
        return command("pinger", Ping())

    with raises(r"kw_only\.build: .*keyword-only parameter 'region'"):
        saga.step(reply=Pong)(build)


def test_a_compensation_signature_is_checked() -> None:
    saga = fresh("comp_signature")
    with raises(r"comp_signature\.undo: takes \(data\) or \(data, ctx\), not 3 arguments"):
        saga.compensation("undo")(lambda data, ctx, extra: None)


def test_a_compensation_may_be_a_builder_or_an_action() -> None:
    saga = fresh("comp_kinds")

    async def undo_locally(_data: Data, _ctx: StepContext) -> None:
        return None

    assert saga.compensation("unping")(ping).local is False
    assert saga.compensation()(undo_locally).local is True


@pytest.mark.parametrize("timeout", [0, -1, timedelta(0)])
def test_timeouts_are_positive(timeout: float | timedelta) -> None:
    saga = fresh("timeouts")
    with raises(r"timeouts\.ping: timeout must be positive"):
        saga.step(reply=Pong, timeout=timeout)(ping)


def test_retry_must_be_a_retry_policy() -> None:
    # retry=3 used to be accepted and broke the decider at the step's first failure.
    saga = fresh("retry_type")
    with raises(r"retry_type\.ping: retry= must be a Retry"):
        saga.step(reply=Pong, retry=3)(ping)  # type: ignore[arg-type]
    with raises(r"retry_type\.undo: retry= must be a Retry"):
        saga.compensation("undo", retry="often")(ping)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, "attempts must be at least 1"),
        ({"initial": -1}, "delays must be >= 0"),
        ({"backoff": 0.5}, "backoff >= 1"),
        ({"jitter": 1.5}, "jitter is a fraction"),
    ],
)
def test_retry_policies_validate_themselves(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Retry(**kwargs)


def test_the_data_type_must_be_decodable() -> None:
    with raises("saga 'bad_data': data type 3 is not msgspec-decodable"):
        Saga("bad_data", data=3)  # type: ignore[arg-type]


def test_a_builder_that_returns_no_command_fails_its_step_at_run_time() -> None:
    # What cannot be known at import time: the builder ran and returned something else.
    saga = fresh("returns_junk")

    @saga.step(reply=Pong)
    def junk(_data: Data) -> Command:
        return "not a command"  # type: ignore[return-value]

    runner = SagaRunner(saga)
    state = runner.run(Data())
    assert state.status == "failed"
    attempt = state.steps["junk"].attempts[0]
    assert attempt.outcome == "permanent"
    assert attempt.error is not None
    assert "returns_junk.junk: the builder returned str, not command(...)" in attempt.error


def test_a_registry_names_the_contexts_a_contexts_children_run_in() -> None:
    registry = Registry([sagas.parent, sagas.invoicing, sagas.fan])
    assert registry.child_contexts(sagas.CONTEXT) == frozenset({"billing"})
    assert registry.child_contexts("billing") == frozenset()
    assert registry.child_contexts("elsewhere") == frozenset()
    assert registry.child_contexts(sagas.CONTEXT) is registry.child_contexts(sagas.CONTEXT)  # worked out once
