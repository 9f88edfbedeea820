"""Declaring composed steps: parallel groups, first-of-N, maps, child sagas and TCC steps.

Each is one step of the saga's step list (so the saga's position, versioning and
compensation order work as for any step); what is special lives in the step's spec:

- a **group** (:meth:`Composition.parallel`, :meth:`Composition.first_of`,
  :meth:`Composition.map`, :meth:`Composition.map_child`) runs branches -- each one command,
  local action or child saga with its own compensation, retries and timeout -- at most
  ``concurrency`` at a time. ``parallel`` and ``map`` need every branch (fan-in), and
  ``first_of`` takes the first branch that succeeds. A map's branch count comes from the
  saga's data and is capped by ``limit``;
- a **child** step (:meth:`Composition.child`, or a group's ``child`` branch) starts
  another saga, possibly in another context, and ends when it ends;
- a **TCC** step (:meth:`Composition.tcc`) reserves (try), and is confirmed when the saga
  succeeds or cancelled (its compensation) when it fails or the reservation expires.

``saga/core/group_rules.py`` and ``saga/core/tcc_rules.py`` hold the decider's rules for them;
``docs/composition.md`` explains them with examples.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from saga.definition.retry import NO_RETRY, Retry
from saga.errors import DefinitionError

if TYPE_CHECKING:
    from saga.definition.saga import Command, Saga, Step, StepKind

D = TypeVar("D")
O = TypeVar("O")  # noqa: E741 - the conventional name for an output type variable
T = TypeVar("T")

__all__ = ["GROUP_KINDS", "Group", "GroupSpec"]
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
        """A map's items (``ValueError`` when there are more than ``limit``)."""
        assert self.items is not None  # noqa: S101 - maps only
        found = self.items(data)
        if not isinstance(found, Sequence) or isinstance(found, str | bytes):
            raise TypeError(f"items() must return a list, not {type(found).__name__}")
        if len(found) > self.limit:
            raise ValueError(f"{len(found)} items, over the map's limit of {self.limit}")
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

    def __init__(self, saga: Composition[D], step: Step[D, Any]) -> None:
        self._saga = saga
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

        def register(function: Callable[..., Command]) -> Step[D, O]:
            branch_name = name or function.__name__
            if inspect.iscoroutinefunction(function):
                raise DefinitionError(
                    f"{self._saga.name}.{branch_name}: a command branch's builder must be a plain function"
                )
            return self._saga._branch_step(
                self.group_step,
                branch_name,
                function,
                kind="command",
                output_type=reply,
                compensate=compensate,
                retry=retry,
                timeout=timeout,
            )

        return register

    def action(
        self,
        *,
        compensate: str | None = None,
        retry: Retry = Retry(),
        timeout: float | timedelta | None = None,
        name: str | None = None,
    ) -> Callable[[Callable[..., Any]], Step[D, Any]]:
        """Add a local-action branch: ``async def fn(data[, ctx]) -> Output`` (as ``Saga.action``)."""

        def register(function: Callable[..., Any]) -> Step[D, Any]:
            branch_name = name or function.__name__
            if not inspect.iscoroutinefunction(function):
                raise DefinitionError(f"{self._saga.name}.{branch_name}: an action must be 'async def'")
            output = self._saga._action_output(function, f"{self._saga.name}.{branch_name}")
            return self._saga._branch_step(
                self.group_step,
                branch_name,
                function,
                kind="action",
                output_type=output,
                compensate=compensate,
                retry=retry,
                timeout=timeout,
            )

        return register

    def child(
        self,
        name: str,
        *,
        saga: Saga[T],
        data: Callable[[D], T],
        compensate: str | None = None,
    ) -> Step[D, Any]:
        """Add a branch that runs a child saga (see :meth:`Composition.child`)."""
        spec = self._saga._child_spec(name, saga, data, per_item=False)
        return self._saga._branch_step(
            self.group_step,
            name,
            _no_builder,
            kind="child",
            output_type=child_output_type(saga),
            compensate=compensate,
            retry=NO_RETRY,
            timeout=None,
            child=spec,
        )


class Composition(Generic[D]):
    """The composition methods of :class:`~saga.Saga` (see the module docstring)."""

    name: str
    steps: list[Step[D, Any]]

    # -- provided by Saga ------------------------------------------------------------------

    def _add_step(
        self,
        step_name: str,
        function: Callable[..., Any],
        *,
        kind: StepKind,
        output_type: Any,
        compensate: str | None,
        retry: Retry,
        timeout: float | timedelta | None,
        **extra: Any,
    ) -> Step[D, Any]:
        raise NotImplementedError

    def _branch_step(
        self,
        group: Step[D, Any],
        name: str,
        function: Callable[..., Any],
        *,
        kind: StepKind,
        output_type: Any,
        compensate: str | None,
        retry: Retry,
        timeout: float | timedelta | None,
        **extra: Any,
    ) -> Step[D, Any]:
        raise NotImplementedError

    def _action_output(self, function: Callable[..., Any], where: str) -> Any:
        raise NotImplementedError

    # -- groups ----------------------------------------------------------------------------

    def parallel(self, name: str, *, concurrency: int | None = None) -> Group[D]:
        """Add a fan-out/fan-in group: its branches run side by side, all must succeed.

        Add branches with the group's ``step``, ``action`` and ``child``. At most
        ``concurrency`` run at once (the next starts as one completes). If a branch fails
        for good, no further branch starts, the ones in flight are awaited (an attempt in
        flight may take effect, so its outcome decides), and every completed branch -- then
        every earlier step -- is compensated, in reverse order of completion.
        """
        return self._group(name, "parallel", "all", concurrency)

    def first_of(self, name: str, *, concurrency: int | None = None) -> Group[D]:
        """Add a first-of-N group: the first branch to succeed wins; the step fails if all fail.

        When a branch wins, no further branch starts; the others in flight are awaited (child
        sagas among them are cancelled), and those that completed anyway are compensated
        before the saga moves on, so nothing but the winner's effect stays.
        """
        return self._group(name, "first_of", "first", concurrency)

    def _group(self, name: str, kind: StepKind, mode: GroupMode, concurrency: int | None) -> Group[D]:
        _check_concurrency(concurrency, f"{self.name}.{name}")
        spec = GroupSpec(mode=mode, concurrency=concurrency)
        output: Any = dict[str, Any] if mode == "all" else Any
        return Group(self, self._group_step(name, kind, output, spec))

    def _group_step(self, name: str, kind: StepKind, output_type: Any, spec: GroupSpec) -> Step[D, Any]:
        """Register the step that holds a group's branches (it runs nothing itself)."""
        return self._add_step(
            name,
            _no_builder,
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
        """Add a dynamic parallel step: one command per item of ``items(data)``.

        The builder is ``fn(data, item)`` or ``fn(data, item, ctx)`` (``ctx.branch`` is the
        item's index). At most ``concurrency`` commands are in flight; more than ``limit``
        items fail the step (a hard limit, checked when the step begins). Each branch has
        its own retries and timeout (``retry``, ``timeout``) and its own compensation
        (``compensate``; ``ctx.item`` and ``ctx.branch_output(step)`` tell it which). The
        step's output is the list of every branch's output, in item order.
        """

        def register(function: Callable[..., Command]) -> Step[D, list[O]]:
            step_name = name or function.__name__
            where = f"{self.name}.{step_name}"
            if inspect.iscoroutinefunction(function):
                raise DefinitionError(
                    f"{where}: a map's builder must be a plain function returning a command"
                )
            spec = self._map_spec(items, concurrency, limit, where)
            step = self._group_step(step_name, "map", list[reply], spec)  # type: ignore[valid-type]
            self._branch_step(
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
        """Add a dynamic parallel step that runs one child saga per item.

        ``data(parent_data, item)`` is each child's data. With ``concurrency=1`` the children
        run one after the other (a sequential approval chain is one). The output is the list
        of the children's outputs (each child's last step's output), in item order.
        """
        where = f"{self.name}.{name}"
        spec = self._map_spec(items, concurrency, limit, where)
        child = self._child_spec(name, saga, data, per_item=True)
        output = child_output_type(saga)
        step = self._group_step(name, "map", list[output], spec)  # type: ignore[valid-type]
        self._branch_step(
            step,
            name,
            _no_builder,
            kind="child",
            output_type=output,
            compensate=compensate,
            retry=NO_RETRY,
            timeout=None,
            child=child,
        )
        return step

    def _map_spec(
        self, items: Callable[[D], Sequence[Any]], concurrency: int | None, limit: int, where: str
    ) -> GroupSpec:
        if not callable(items):
            raise DefinitionError(f"{where}: items must be a function of the saga's data")
        _check_concurrency(concurrency, where)
        if not 1 <= limit <= MAX_BRANCHES:
            raise DefinitionError(f"{where}: limit must be between 1 and {MAX_BRANCHES}")
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
        """Add a step that runs another saga (a child, possibly in another context) to its end.

        ``data(parent_data)`` is the child's data; the child's id is ``<parent id>/<step>``,
        so starting it again is a no-op. The step succeeds with the child's output (the
        output of the child's last step) when the child completes, and fails for good when
        it ends otherwise (failed, compensated, cancelled). Cancelling the parent (or its
        deadline) cancels the child. The child is neither retried nor timed out by the parent:
        bound it with the child's own ``deadline``. ``compensate`` undoes a completed child
        if the parent fails later (an ended saga cannot be reopened).
        """
        spec = self._child_spec(name, saga, data, per_item=False)
        return self._add_step(
            name,
            _no_builder,
            kind="child",
            output_type=child_output_type(saga),
            compensate=compensate,
            retry=NO_RETRY,
            timeout=None,
            child=spec,
        )

    def _child_spec(
        self, name: str, saga: Saga[Any], data: Callable[..., Any], *, per_item: bool
    ) -> ChildSpec:
        where = f"{self.name}.{name}"
        if not hasattr(saga, "encode_data") or not hasattr(saga, "key"):
            raise DefinitionError(f"{where}: saga= must be a Saga definition, not {saga!r}")
        if saga is self:
            raise DefinitionError(f"{where}: a saga cannot be its own child")
        if not callable(data):
            raise DefinitionError(f"{where}: data must be a function making the child's data")
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
        """Add a try-confirm/cancel step: the builder sends the *try* (a reservation).

        ``confirm`` and ``cancel`` name compensations (``@saga.compensation()``): the
        confirmation is sent when every step of the saga has succeeded (the saga completes
        when every TCC step is confirmed), the cancellation when the saga fails, is
        cancelled, or the reservation expires. ``expires`` is the reservation's lifetime,
        from the try's dispatch: a durable timer fails the saga (and cancels the
        reservation) if it is not confirmed by then. Both are idempotent (keys
        ``<saga>:<step>:confirm`` and ``:undo``) and retried by their compensation's policy;
        one that fails for good dead-letters the saga.
        """

        def register(function: Callable[..., Command]) -> Step[D, O]:
            step_name = name or function.__name__
            where = f"{self.name}.{step_name}"
            if inspect.iscoroutinefunction(function):
                raise DefinitionError(f"{where}: a TCC step's try builder must be a plain function")
            if not isinstance(expires, timedelta) or expires <= timedelta():
                raise DefinitionError(f"{where}: expires must be a positive timedelta")
            if confirm == cancel:
                raise DefinitionError(f"{where}: confirm and cancel must be different compensations")
            return self._add_step(
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


def _check_concurrency(concurrency: int | None, where: str) -> None:
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise DefinitionError(f"{where}: concurrency must be a positive integer or None")


def child_output_type(saga: Saga[Any]) -> Any:
    """A child step's output type: the type the child's last step's output decodes as.

    The parent's step declares it, and the child's end report is sent as a reply of it.
    """
    if not saga.steps:
        raise DefinitionError(f"child saga {saga.name!r} has no steps (declare them before using it)")
    return saga.steps[-1].value_type


def _no_builder(data: object) -> None:
    """The ``function`` of a step the engine builds itself (groups, children)."""
