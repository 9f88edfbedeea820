"""The decorator core: how every step, branch and compensation of a saga is declared.

:class:`Declarations` is the one place a :class:`~saga.definition.step.Step` is made and
checked (its name, retry policy, builder signature, output type and timeout); a saga adds
its steps through it, and a group its branches. :func:`command_step` and
:func:`action_step` are the one implementation of ``@saga.step``/``@group.step`` and
``@saga.action``/``@group.action``: they get where the step goes as an :class:`AddStep`.
Every check raises a :class:`~saga.errors.DefinitionError` naming the saga and the step.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import msgspec

from saga.definition.retry import Retry
from saga.definition.step import NAME, Builder, Command, Step, StepKind
from saga.definition.where import Where
from saga.errors import DefinitionError

if TYPE_CHECKING:
    from saga.definition.saga import Saga

D = TypeVar("D")
O = TypeVar("O")  # noqa: E741 - the conventional name for an output type variable


def no_builder(data: object) -> None:
    """The ``function`` of a step the engine runs itself (waits, groups, child sagas)."""


class AddStep(Protocol[D]):
    """Where a declared step goes: the saga's step list, or a group's branches."""

    def __call__(
        self,
        step_name: str,
        function: Builder,
        *,
        kind: StepKind,
        output_type: Any,
        compensate: str | None,
        retry: Retry,
        timeout: float | timedelta | None,
        **spec: Any,
    ) -> Step[D, Any]:
        """Check and add the step; return it."""
        ...


def command_step(
    saga: str,
    add: AddStep[D],
    *,
    reply: type[O],
    compensate: str | None,
    retry: Retry,
    timeout: float | timedelta | None,
    name: str | None,
) -> Callable[[Callable[..., Command]], Step[D, O]]:
    """The decorator of a command step or branch: ``fn(data[, ctx])`` returns a command."""

    def register(function: Callable[..., Command]) -> Step[D, O]:
        step_name = name or function.__name__
        if inspect.iscoroutinefunction(function):
            raise Where(saga, step_name).error(
                "a command step's builder must be a plain function returning command(...); "
                "use .action for async local work"
            )
        return add(
            step_name,
            function,
            kind="command",
            output_type=reply,
            compensate=compensate,
            retry=retry,
            timeout=timeout,
        )

    return register


def action_step(
    saga: str,
    add: AddStep[D],
    *,
    compensate: str | None,
    retry: Retry,
    timeout: float | timedelta | None,
    name: str | None,
) -> Callable[[Callable[..., Awaitable[O]]], Step[D, O]]:
    """The decorator of a local action step or branch: ``async def fn(data[, ctx]) -> Output``."""

    def register(function: Callable[..., Awaitable[O]]) -> Step[D, O]:
        step_name = name or function.__name__
        where = Where(saga, step_name)
        if not inspect.iscoroutinefunction(function):
            raise where.error("an action must be an 'async def' function")
        return add(
            step_name,
            function,
            kind="action",
            output_type=return_type(function, where),
            compensate=compensate,
            retry=retry,
            timeout=timeout,
        )

    return register


class Declarations(Generic[D]):
    """Making a saga's steps and branches: every check a single step needs, in one place."""

    def __init__(self, saga: Saga[D]) -> None:
        self.saga = saga

    def add(
        self,
        step_name: str,
        function: Builder,
        *,
        kind: StepKind,
        output_type: Any,
        compensate: str | None,
        retry: Retry,
        timeout: float | timedelta | None,
        **spec: Any,
    ) -> Step[D, Any]:
        """Add a step at the end of the saga (an :class:`AddStep`)."""
        step = self._new(
            step_name,
            function,
            index=len(self.saga.steps),
            kind=kind,
            output_type=output_type,
            compensate=compensate,
            retry=retry,
            timeout=timeout,
            **spec,
        )
        self.saga.steps.append(step)
        return step

    def add_branch(
        self,
        group: Step[D, Any],
        name: str,
        function: Builder,
        *,
        kind: StepKind,
        output_type: Any,
        compensate: str | None,
        retry: Retry,
        timeout: float | timedelta | None,
        **spec: Any,
    ) -> Step[D, Any]:
        """Add a branch to group step ``group`` (a map has exactly one branch step)."""
        group_spec = group.group
        assert group_spec is not None  # noqa: S101 - only group steps get branches
        if group_spec.dynamic and group_spec.branches:
            raise Where(self.saga.name, group.name).error("a map runs one branch step")
        if kind == "child" and group_spec.dynamic and name != group.name:
            raise Where(self.saga.name, name).error("a map's child is declared with map_child")
        step = self._new(
            name,
            function,
            index=group.index,
            kind=kind,
            output_type=output_type,
            compensate=compensate,
            retry=retry,
            timeout=timeout,
            within=group.name,
            position=len(group_spec.branches),
            inputs=2 if group_spec.dynamic and kind != "child" else 1,
            unique=not group_spec.dynamic,
            **spec,
        )
        group_spec.branches.append(step)
        return step

    def _new(
        self,
        step_name: str,
        function: Builder,
        *,
        index: int,
        kind: StepKind,
        output_type: Any,
        compensate: str | None,
        retry: Retry,
        timeout: float | timedelta | None,
        inputs: int = 1,
        unique: bool = True,
        **spec: Any,
    ) -> Step[D, Any]:
        where = Where(self.saga.name, step_name)
        check_name(step_name, where)
        check_retry(retry, where)
        if unique and step_name in self.names():
            raise where.error("a step with this name is already declared")
        if output_type is not None and not _encodable(output_type):
            raise where.error(f"output type {output_type!r} is not msgspec-encodable")
        return Step(
            saga=self.saga.name,
            name=step_name,
            index=index,
            function=function,
            kind=kind,
            takes_context=takes_context(function, where, inputs),
            output_type=output_type,
            compensate=compensate,
            retry=retry,
            timeout_s=seconds(timeout, where),
            _definition=self.saga,
            **spec,
        )

    def names(self) -> set[str]:
        """Every step and branch name declared so far."""
        names = {s.name for s in self.saga.steps}
        for step in self.saga.steps:
            if step.group is not None:
                names |= {b.name for b in step.group.branches}
        return names


def check_name(name: str, where: Where) -> None:
    """A step's, branch's or compensation's name: letters, digits, ``_ . -``, at most 64."""
    if not NAME.fullmatch(name):
        raise where.error("invalid name (letters, digits, _ . -; at most 64)")


def check_retry(retry: object, where: Where) -> None:
    """``retry=`` is a :class:`~saga.definition.retry.Retry`."""
    if not isinstance(retry, Retry):
        raise where.error(f"retry= must be a Retry(...), not {retry!r}")


def takes_context(function: Builder, where: Where, inputs: int = 1) -> bool:
    """Check a builder's or action's signature: ``(data)`` or ``(data, ctx)``.

    A map's builder takes the item too: ``(data, item)`` or ``(data, item, ctx)``.
    """
    every = inspect.signature(function).parameters.values()
    for p in every:
        if p.kind == p.KEYWORD_ONLY and p.default is p.empty:
            raise where.error(
                f"required keyword-only parameter {p.name!r} (the engine calls fn(data[, ctx]))"
            )
    parameters = [
        p for p in every if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(parameters) not in (inputs, inputs + 1):
        expected = "(data) or (data, ctx)" if inputs == 1 else "(data, item) or (data, item, ctx)"
        raise where.error(f"takes {expected}, not {len(parameters)} arguments")
    return len(parameters) == inputs + 1


def return_type(function: Builder, where: Where) -> Any:
    """An action's output type: its return annotation (``None`` for ``-> None``)."""
    try:
        hints = typing.get_type_hints(function)
    except NameError as error:
        raise where.error(f"cannot resolve the return annotation: {error}") from error
    if "return" not in hints:
        raise where.error("annotate the action's return type (its output)")
    output = hints["return"]
    return None if output is type(None) else output


def _encodable(output_type: Any) -> bool:
    try:
        msgspec.json.Decoder(output_type)
    except TypeError:
        return False
    return True


def seconds(value: float | timedelta | None, where: Where, what: str = "timeout") -> float | None:
    """A timeout (or deadline) in seconds; ``None`` stays ``None``; it must be positive."""
    if value is None:
        return None
    found = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if found <= 0:
        raise where.error(f"{what} must be positive")
    return found


def check_whole(saga: Saga[Any]) -> None:
    """What :meth:`Saga.validate` checks: what needs the whole definition.

    It has steps, every group a branch, every ``compensate=`` and ``confirm=`` names a
    declared compensation and every compensation undoes a step; child sagas are checked too.
    """
    if not saga.steps:
        raise DefinitionError("has no steps", saga=saga.name)
    used = set()
    for step in [*saga.steps, *saga.branch_steps()]:
        where = Where(saga.name, step.name)
        if step.group is not None and not step.group.branches:
            raise where.error(f"a {step.kind} group needs at least one branch")
        if step.child is not None:
            step.child.definition.validate()
        names = [("compensate", step.compensate)] if step.compensate else []
        if step.tcc is not None:
            names.append(("confirm", step.tcc.confirm))
        for what, name in names:
            if name not in saga.compensations:
                raise where.error(
                    f"{what}={name!r} names no declared compensation "
                    f"(declared: {', '.join(sorted(saga.compensations)) or 'none'})"
                )
            used.add(name)
    unused = set(saga.compensations) - used
    if unused:
        raise DefinitionError(f"compensations {', '.join(sorted(unused))} undo no step", saga=saga.name)
