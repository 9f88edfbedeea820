"""Declaring composed steps: parallel groups, first-of-N, maps, child sagas and TCC steps.

Each is one step of the saga's step list (so the saga's position, versioning and
compensation order work as for any step); what is special lives in the step's spec:

- a **group** (:meth:`Saga.parallel`, :meth:`Saga.first_of`,
  :meth:`Saga.map`, :meth:`Saga.map_child`) runs branches -- each one command,
  local action or child saga with its own compensation, retries and timeout -- at most
  ``concurrency`` at a time. ``parallel`` and ``map`` need every branch (fan-in), and
  ``first_of`` takes the first branch that succeeds. A map's branch count comes from the
  saga's data and is capped by ``limit``;
- a **child** step (:meth:`Saga.child`, or a group's ``child`` branch) starts
  another saga, possibly in another context, and ends when it ends;
- a **TCC** step (:meth:`Saga.tcc`) reserves (try), and is confirmed when the saga
  succeeds or cancelled (its compensation) when it fails or the reservation expires.

``saga/core/group_rules.py`` and ``saga/core/tcc_rules.py`` hold the decider's rules for them;
``docs/composition.md`` explains them with examples.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from saga.definition.declare import Declarations, action_step, command_step, no_builder
from saga.definition.retry import NO_RETRY, Retry
from saga.definition.where import Where
from saga.errors import DefinitionError, TooManyItems

if TYPE_CHECKING:
    from saga.definition.saga import Saga
    from saga.definition.step import Builder, Command, Step, StepKind

D = TypeVar("D")
O = TypeVar("O")  # noqa: E741 - the conventional name for an output type variable
T = TypeVar("T")

__all__ = ["GROUP_KINDS", "ChildSpec", "Composer", "Group", "GroupSpec", "TccSpec", "child_output_type"]
GROUP_KINDS: typing.Final = frozenset({"parallel", "first_of", "map"})
MAX_BRANCHES: typing.Final = 100_000
"""The highest ``limit`` a map may declare."""

GroupMode = Literal["all", "first"]


@dataclass(eq=False, slots=True)
class GroupSpec:
    """What a group step runs: its branches, how many at once, and (maps) its items.

    Attributes:
        mode: ``"all"`` (fan-in: every branch must succeed) or ``"first"`` (the first
            branch to succeed wins).
        concurrency: Most branches in flight at once (``None``: all of them).
        branches: The branch steps, in index order; a map has one, run once per item.
        items: A map's function of the saga's data returning its items (one branch each).
        limit: A map's hard limit on the item count; more items fail the step.

    """

    mode: GroupMode
    concurrency: int | None
    branches: list[Step[Any, Any]] = field(default_factory=list)
    items: Callable[[Any], Sequence[Any]] | None = None
    limit: int = 0

    @property
    def dynamic(self) -> bool:
        """Whether the branch count comes from the data (a map)."""
        return self.items is not None

    def items_of(self, data: object) -> Sequence[Any]:
        """A map's items (:class:`~saga.errors.TooManyItems` when there are more than ``limit``)."""
        assert self.items is not None  # noqa: S101 - maps only
        found = self.items(data)
        if not isinstance(found, Sequence) or isinstance(found, str | bytes):
            raise TypeError(f"items() must return a list, not {type(found).__name__}")
        if len(found) > self.limit:
            raise TooManyItems(len(found), self.limit)
        return found

    def count(self, data: object) -> int:
        """How many branches a run of this group has for ``data``."""
        return len(self.items_of(data)) if self.dynamic else len(self.branches)

    def branch(self, index: int) -> Step[Any, Any]:
        """The step that branch ``index`` runs (``IndexError`` past the fixed branches)."""
        if self.dynamic:
            return self.branches[0]
        return self.branches[index]


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """The saga a child step starts, and how its data is made from the parent's."""

    definition: Saga[Any]
    data: Callable[..., Any]
    per_item: bool = False
    """A map's child: ``data(parent_data, item)`` instead of ``data(parent_data)``."""


@dataclass(frozen=True, slots=True)
class TccSpec:
    """A TCC step's confirmation (a compensation name) and reservation lifetime."""

    confirm: str
    expires_s: float


class Composer(Generic[D]):
    """Declaring a saga's composed steps: groups, maps, child sagas and TCC steps.

    :class:`~saga.Saga` delegates its ``parallel``, ``first_of``, ``map``, ``map_child``,
    ``child`` and ``tcc`` to one of these (their docstrings are there); it adds steps and
    branches through the saga's :class:`~saga.definition.declare.Declarations`.
    """

    def __init__(self, saga: Saga[D], declarations: Declarations[D]) -> None:
        self.saga = saga
        self.declared = declarations

    # -- groups ----------------------------------------------------------------------------

    def parallel(self, name: str, *, concurrency: int | None = None) -> Group[D]:
        """Add a fan-out/fan-in group (see :meth:`saga.Saga.parallel`)."""
        return self._group(name, "parallel", "all", concurrency)

    def first_of(self, name: str, *, concurrency: int | None = None) -> Group[D]:
        """Add a first-of-N group (see :meth:`saga.Saga.first_of`)."""
        return self._group(name, "first_of", "first", concurrency)

    def _group(self, name: str, kind: StepKind, mode: GroupMode, concurrency: int | None) -> Group[D]:
        _check_concurrency(concurrency, Where(self.saga.name, name))
        spec = GroupSpec(mode=mode, concurrency=concurrency)
        output: Any = dict[str, Any] if mode == "all" else Any
        return Group(self, self._group_step(name, kind, output, spec))

    def _group_step(self, name: str, kind: StepKind, output_type: Any, spec: GroupSpec) -> Step[D, Any]:
        """Register the step that holds a group's branches (it runs nothing itself)."""
        return self.declared.add(
            name,
            no_builder,
            kind=kind,
            output_type=output_type,
            compensate=None,
            retry=NO_RETRY,
            timeout=None,
            group=spec,
        )

    def map(
        self,
        *,
        items: Callable[[D], Sequence[Any]],
        reply: type[O],
        compensate: str | None = None,
        concurrency: int | None = None,
        limit: int = 1_000,
        retry: Retry = Retry(),
        timeout: float | timedelta | None = None,
        name: str | None = None,
    ) -> Callable[[Callable[..., Command]], Step[D, list[O]]]:
        """Add a dynamic parallel step of commands (see :meth:`saga.Saga.map`)."""

        def register(function: Callable[..., Command]) -> Step[D, list[O]]:
            step_name = name or function.__name__
            where = Where(self.saga.name, step_name)
            if inspect.iscoroutinefunction(function):
                raise where.error("a map's builder must be a plain function returning a command")
            spec = self._map_spec(items, concurrency, limit, where)
            step = self._group_step(step_name, "map", list[reply], spec)  # type: ignore[valid-type]
            self.declared.add_branch(
                step,
                step_name,
                function,
                kind="command",
                output_type=reply,
                compensate=compensate,
                retry=retry,
                timeout=timeout,
            )
            return step

        return register

    def map_child(
        self,
        name: str,
        *,
        saga: Saga[T],
        items: Callable[[D], Sequence[Any]],
        data: Callable[[D, Any], T],
        concurrency: int | None = None,
        limit: int = 1_000,
        compensate: str | None = None,
    ) -> Step[D, list[Any]]:
        """Add a dynamic parallel step of child sagas (see :meth:`saga.Saga.map_child`)."""
        where = Where(self.saga.name, name)
        spec = self._map_spec(items, concurrency, limit, where)
        child = self.child_spec(name, saga, data, per_item=True)
        output = child_output_type(saga)
        step = self._group_step(name, "map", list[output], spec)  # type: ignore[valid-type]
        self.declared.add_branch(
            step,
            name,
            no_builder,
            kind="child",
            output_type=output,
            compensate=compensate,
            retry=NO_RETRY,
            timeout=None,
            child=child,
        )
        return step

    def _map_spec(
        self, items: Callable[[D], Sequence[Any]], concurrency: int | None, limit: int, where: Where
    ) -> GroupSpec:
        if not callable(items):
            raise where.error("items must be a function of the saga's data")
        _check_concurrency(concurrency, where)
        if not 1 <= limit <= MAX_BRANCHES:
            raise where.error(f"limit must be between 1 and {MAX_BRANCHES}")
        return GroupSpec(mode="all", concurrency=concurrency, items=items, limit=limit)

    # -- child sagas -----------------------------------------------------------------------

    def child(
        self,
        name: str,
        *,
        saga: Saga[T],
        data: Callable[[D], T],
        compensate: str | None = None,
    ) -> Step[D, Any]:
        """Add a step that runs a child saga (see :meth:`saga.Saga.child`)."""
        spec = self.child_spec(name, saga, data, per_item=False)
        return self.declared.add(
            name,
            no_builder,
            kind="child",
            output_type=child_output_type(saga),
            compensate=compensate,
            retry=NO_RETRY,
            timeout=None,
            child=spec,
        )

    def child_spec(
        self, name: str, saga: Saga[Any], data: Callable[..., Any], *, per_item: bool
    ) -> ChildSpec:
        """Check a child step's (or branch's) saga and data function."""
        where = Where(self.saga.name, name)
        if not hasattr(saga, "encode_data") or not hasattr(saga, "key"):
            raise where.error(f"saga= must be a Saga definition, not {saga!r}")
        if saga is self.saga:
            raise where.error("a saga cannot be its own child")
        if not callable(data):
            raise where.error("data must be a function making the child's data")
        return ChildSpec(definition=saga, data=data, per_item=per_item)

    # -- TCC -------------------------------------------------------------------------------

    def tcc(
        self,
        *,
        reply: type[O],
        confirm: str,
        cancel: str,
        expires: timedelta,
        retry: Retry = Retry(),
        timeout: float | timedelta | None = None,
        name: str | None = None,
    ) -> Callable[[Callable[..., Command]], Step[D, O]]:
        """Add a try-confirm/cancel step (see :meth:`saga.Saga.tcc`)."""

        def register(function: Callable[..., Command]) -> Step[D, O]:
            step_name = name or function.__name__
            where = Where(self.saga.name, step_name)
            if inspect.iscoroutinefunction(function):
                raise where.error("a TCC step's try builder must be a plain function")
            if not isinstance(expires, timedelta) or expires <= timedelta():
                raise where.error("expires must be a positive timedelta")
            if confirm == cancel:
                raise where.error("confirm and cancel must be different compensations")
            return self.declared.add(
                step_name,
                function,
                kind="tcc",
                output_type=reply,
                compensate=cancel,
                retry=retry,
                timeout=timeout,
                tcc=TccSpec(confirm=confirm, expires_s=expires.total_seconds()),
            )

        return register


class Group(Generic[D]):
    """A parallel or first-of-N group being declared: add its branches in order.

    Example::

        book = trips.parallel("book", concurrency=2)

        @book.step(reply=FlightBooked, compensate="cancel_flight")
        def flight(data: Trip) -> Command:
            return command("flights", BookFlight(trip_id=data.id))

    Pass the group to ``ctx.output(...)`` for its output: the outputs of every branch by name
    (``parallel``), or the winner's output (``first_of``).
    """

    def __init__(self, composer: Composer[D], step: Step[D, Any]) -> None:
        self._composer = composer
        self.group_step = step

    @property
    def name(self) -> str:
        """The group step's name."""
        return self.group_step.name

    @property
    def spec(self) -> GroupSpec:
        """The group's spec (its branches so far)."""
        assert self.group_step.group is not None  # noqa: S101 - a group step has its spec
        return self.group_step.group

    def _add(self, step_name: str, function: Builder, **declared: Any) -> Step[D, Any]:
        """Add a branch (the :class:`~saga.definition.declare.AddStep` of this group)."""
        return self._composer.declared.add_branch(self.group_step, step_name, function, **declared)

    def step(
        self,
        *,
        reply: type[O],
        compensate: str | None = None,
        retry: Retry = Retry(),
        timeout: float | timedelta | None = None,
        name: str | None = None,
    ) -> Callable[[Callable[..., Command]], Step[D, O]]:
        """Add a command branch: ``fn(data[, ctx])`` returns a command (as ``Saga.step``)."""
        return command_step(
            self._composer.saga.name,
            self._add,
            reply=reply,
            compensate=compensate,
            retry=retry,
            timeout=timeout,
            name=name,
        )

    def action(
        self,
        *,
        compensate: str | None = None,
        retry: Retry = Retry(),
        timeout: float | timedelta | None = None,
        name: str | None = None,
    ) -> Callable[[Callable[..., Awaitable[O]]], Step[D, O]]:
        """Add a local-action branch: ``async def fn(data[, ctx]) -> Output`` (as ``Saga.action``)."""
        return action_step(
            self._composer.saga.name,
            self._add,
            compensate=compensate,
            retry=retry,
            timeout=timeout,
            name=name,
        )

    def child(
        self,
        name: str,
        *,
        saga: Saga[T],
        data: Callable[[D], T],
        compensate: str | None = None,
    ) -> Step[D, Any]:
        """Add a branch that runs a child saga (see :meth:`saga.Saga.child`)."""
        spec = self._composer.child_spec(name, saga, data, per_item=False)
        return self._add(
            name,
            no_builder,
            kind="child",
            output_type=child_output_type(saga),
            compensate=compensate,
            retry=NO_RETRY,
            timeout=None,
            child=spec,
        )


def _check_concurrency(concurrency: int | None, where: Where) -> None:
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise where.error("concurrency must be a positive integer or None")


def child_output_type(saga: Saga[Any]) -> Any:
    """A child step's output type: the type the child's last step's output decodes as.

    The parent's step declares it, and the child's end report is sent as a reply of it.
    """
    if not saga.steps:
        raise DefinitionError("a child saga needs its steps declared before it is used", saga=saga.name)
    return saga.steps[-1].value_type
