"""Declaring sagas: steps, compensations, retry policies and timeouts.

A definition is a :class:`Saga` plus its steps, in declaration order. Decorators check what
they can when applied (signatures, duplicate names, types) and :meth:`Saga.validate`, run
when the definition is registered with an app, a client or a test runner, checks what needs
the whole definition (every ``compensate=`` names a compensation, every compensation is
used). Errors are :class:`~saga.DefinitionError` naming the saga and the step.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

import msgspec

from redsaga.streams import Stream
from saga.definition.composition import ChildSpec, Composition, Group, GroupSpec, TccSpec
from saga.definition.retry import NO_RETRY, Retry
from saga.definition.waits import (
    Duration,
    EventWait,
    SignalWait,
    Sleep,
    WaitSpec,
    check_duration,
    check_one_argument,
)
from saga.errors import DefinitionError, InvalidInput, SagaError

D = TypeVar("D")
O = TypeVar("O")  # noqa: E741 - the conventional name for an output type variable

LOCAL: typing.Final = "_local"
"""The participant name of steps run by the orchestrator's own worker (actions)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
"""Names of sagas, steps, contexts and participants (matched whole: no glob, brace or newline)."""
StepKind = Literal[
    "command", "action", "sleep", "signal", "event", "parallel", "first_of", "map", "child", "tcc"
]
"""What a step does: send a command, run a local action, wait (sleep, signal, event), run
branches (parallel, first_of, map), run a child saga, or reserve then confirm (tcc)."""
WAIT_KINDS: typing.Final = frozenset({"sleep", "signal", "event"})


def check_participant_name(name: str) -> str:
    """``name`` if a participant may have it (names starting with ``_`` are the engine's own)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("_"):
        raise DefinitionError(
            f"invalid participant name {name!r}: 1-64 characters of A-Z a-z 0-9 _ . -, starting with a letter"
        )
    return name


@dataclass(frozen=True, slots=True)
class Command:
    """A command for a participant: what a command step's builder returns."""

    participant: str
    message: object

    def __post_init__(self) -> None:
        check_participant_name(self.participant)
        if not isinstance(self.message, msgspec.Struct):
            raise DefinitionError(
                f"a command's message must be a msgspec Struct, got {type(self.message).__name__}"
            )


def command(participant: str, message: object) -> Command:
    """Build the command that a step sends to ``participant`` (its stream in this context)."""
    return Command(participant, message)


class StepContext:
    """What a step's builder or action can read besides the saga's data.

    In a branch of a group step (and in its compensation), ``step`` is the branch's key
    ``<group>#<index>``, :attr:`branch` its index and :attr:`item` its map item.
    """

    def __init__(
        self,
        saga_id: str,
        step: str,
        attempt: int,
        outputs: Mapping[str, bytes],
        tokens: Callable[[str], str] | None = None,
        *,
        item: Callable[[], Any] | None = None,
    ) -> None:
        self.saga_id = saga_id
        self.step = step
        self.attempt = attempt
        self._outputs = outputs
        self._tokens = tokens
        self._item = item

    @property
    def branch(self) -> int | None:
        """The branch index, in a branch of a group step (``None`` elsewhere)."""
        _, sep, index = self.step.rpartition("#")
        return int(index) if sep and index.isdigit() else None

    @property
    def item(self) -> Any:
        """The item of this branch of a map (``None`` elsewhere)."""
        return self._item() if self._item is not None else None

    def resume_token(self, step: Step[Any, Any] | str) -> str:
        """The resume token of signal step ``step``'s next (or current) wait.

        Send it out (an approval e-mail, a payment provider's callback URL) from a step that
        runs before the wait; whoever holds it can resume the saga once, through
        ``SagaClient.signal`` or ``saga signal``. It is derived from the context's signal
        secret, so the same saga, step and wait always get the same token.
        """
        if self._tokens is None:
            raise SagaError("no signal secret here: resume tokens are made by the engine's decider")
        return self._tokens(step if isinstance(step, str) else step.name)

    @typing.overload
    def output(self, step: Step[Any, O]) -> O: ...
    @typing.overload
    def output(self, step: Group[Any]) -> Any: ...
    def output(self, step: Step[Any, O] | Group[Any]) -> O | Any:
        """The output of an earlier step that succeeded, decoded as that step's output type.

        A branch of a completed ``parallel`` group is a step too; a group gives the outputs
        of its branches by name (``parallel``), the winner's output (``first_of``) or every
        item's output in order (``map``).
        """
        target = step.group_step if isinstance(step, Group) else step
        raw = self._outputs.get(target.name)
        if raw is None:
            raise KeyError(f"step {target.name!r} has no output (it has not succeeded)")
        return target.decode_output(raw)

    def branch_output(self, step: Step[Any, list[O]]) -> O:
        """This branch's own output, in the compensation of a branch of map ``step``."""
        raw = self._outputs.get(self.step)
        if raw is None or not self.step.startswith(f"{step.name}#"):
            raise KeyError(f"{self.step!r} is not a completed branch of {step.name!r}")
        return step.branch_step(self.branch or 0).decode_output(raw)  # type: ignore[no-any-return]

    @property
    def idempotency_key(self) -> str:
        """The key participants dedupe this step on (stable across retries and redeliveries)."""
        return f"{self.saga_id}:{self.step}"


Builder = Callable[..., Any]


@dataclass(frozen=True, eq=False, slots=True)
class Compensation:
    """How to undo a step (or confirm a TCC step): a command builder or a local async action."""

    name: str
    function: Builder
    local: bool
    takes_context: bool
    retry: Retry
    timeout_s: float | None
    _definition: Any = field(default=None, repr=False)


@dataclass(frozen=True, eq=False, slots=True)
class Step(Generic[D, O]):
    """One step of a saga: sends a command to a participant, or runs a local async action.

    The decorators return this object; pass it to :meth:`StepContext.output` to read the
    step's output in a later step.
    """

    saga: str
    name: str
    index: int
    function: Builder
    kind: StepKind
    takes_context: bool
    output_type: type[O] | None
    compensate: str | None
    retry: Retry
    timeout_s: float | None
    _definition: Saga[D] = field(repr=False)
    wait: WaitSpec | None = None
    group: GroupSpec | None = None
    """A group step's branches (kinds ``parallel``, ``first_of``, ``map``)."""
    child: ChildSpec | None = None
    """The saga a ``child`` step (or branch) runs."""
    tcc: TccSpec | None = None
    """A ``tcc`` step's confirmation and reservation lifetime."""
    within: str = ""
    """For a branch: the name of its group step."""
    position: int = 0
    """For a branch: its index in the group (a map's single branch step: 0)."""

    @property
    def local(self) -> bool:
        """Whether the step is a local action (run by the orchestrator's worker)."""
        return self.kind == "action"

    @property
    def waits(self) -> bool:
        """Whether the step waits (sleep, signal or event) instead of sending a command."""
        return self.kind in WAIT_KINDS

    @property
    def value_type(self) -> Any:
        """The type the step's output decodes as (``None``: the step has no output).

        Its output type, except for a first-of-N group, whose output is its winner's: the
        branches' output type when they all have the same one, else plain JSON values
        (``Any``).
        """
        if self.group is not None and self.group.mode == "first":
            types = {b.output_type for b in self.group.branches}
            return types.pop() if len(types) == 1 else Any
        return self.output_type

    def decode_output(self, raw: bytes) -> O:
        """Decode a recorded output as :attr:`value_type` (``InvalidInput`` when it does not match)."""
        output_type = self.value_type
        if output_type is None:
            return typing.cast(O, None)
        try:
            return typing.cast(O, msgspec.json.decode(raw, type=output_type))
        except msgspec.ValidationError as error:
            raise InvalidInput(
                f"{self.saga}.{self.name}: output is not a valid "
                f"{getattr(output_type, '__name__', output_type)}: {error}"
            ) from error

    @property
    def compensation(self) -> Compensation | None:
        """The registered compensation, if the step has one."""
        return self._definition.compensations.get(self.compensate) if self.compensate else None

    @property
    def confirmation(self) -> Compensation | None:
        """A TCC step's confirmation."""
        return self._definition.compensations.get(self.tcc.confirm) if self.tcc else None

    @property
    def is_group(self) -> bool:
        """Whether the step runs branches (``parallel``, ``first_of`` or ``map``)."""
        return self.group is not None

    @property
    def per_item(self) -> bool:
        """Whether this is a map's branch step (its builder takes the item)."""
        group = self._definition.step_named(self.within).group if self.within else None
        return group is not None and group.dynamic

    def branch_step(self, index: int) -> Step[D, Any]:
        """The step that branch ``index`` of this group runs."""
        if self.group is None:
            raise KeyError(f"{self.saga}.{self.name} is not a group step")
        return self.group.branch(index)

    @property
    def branches(self) -> dict[str, list[Step[D, Any]]]:
        """A group's branches for its shape: ``<index>:<name>`` (a map: ``each``) -> steps."""
        if self.group is None:
            return {}
        if self.group.dynamic:
            return {"each": list(self.group.branches)}
        return {f"{b.position}:{b.name}": [b] for b in self.group.branches}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the step's function directly (handy in unit tests of builders)."""
        return self.function(*args, **kwargs)


@dataclass(frozen=True, slots=True)
class Context:
    """A bounded context: its name and how many partitions its sagas are spread over.

    Every saga of the context lives in partition ``crc32(saga_id) % partitions``; all keys of
    one partition share a hash tag, so transitions stay single-slot on Redis Cluster.
    """

    name: str
    partitions: int = 1

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or ":" in self.name:
            raise DefinitionError(f"invalid context name {self.name!r}")
        if not 1 <= self.partitions <= 1024:
            raise DefinitionError(f"context {self.name!r}: partitions must be between 1 and 1024")


class Saga(Composition[D]):
    """A saga definition: a name, a version, a bounded context, typed data and ordered steps.

    Example::

        orders = Saga("order_fulfilment", version=1, context="orders", data=Order)

        @orders.step(reply=StockReserved, compensate="release_stock")
        def reserve_stock(data: Order) -> Command:
            return command("inventory", ReserveStock(order_id=data.id, items=data.items))

        @orders.compensation()
        def release_stock(data: Order, ctx: StepContext) -> Command:
            return command("inventory", ReleaseStock(order_id=data.id))
    """

    def __init__(
        self,
        name: str,
        *,
        data: type[D],
        version: int = 1,
        context: str | Context = "default",
        deadline: timedelta | None = None,
    ) -> None:
        if not _NAME.fullmatch(name) or "@" in name:
            raise DefinitionError(f"invalid saga name {name!r} (letters, digits, _ . -)")
        if version < 1:
            raise DefinitionError(f"saga {name!r}: version must be a positive integer")
        self.name = name
        self.version = version
        self.context = context if isinstance(context, Context) else Context(context)
        self.data_type = data
        self.deadline_s = _seconds(deadline, f"saga {name!r} deadline")
        """Seconds from the start after which an unfinished saga is compensated (``None``: never)."""
        self.steps: list[Step[D, Any]] = []
        self.compensations: dict[str, Compensation] = {}
        self._encoder = msgspec.json.Encoder()
        try:
            self._data_decoder = msgspec.json.Decoder(data)
        except TypeError as error:
            raise DefinitionError(f"saga {name!r}: data type {data!r} is not msgspec-decodable") from error

    @property
    def key(self) -> str:
        """``name@version``: how the registry and the indexes name this definition."""
        return f"{self.name}@{self.version}"

    def step(
        self,
        *,
        reply: type[O],
        compensate: str | None = None,
        retry: Retry = Retry(),
        timeout: float | timedelta | None = None,
        name: str | None = None,
    ) -> Callable[[Callable[..., Command]], Step[D, O]]:
        """Declare a command step: ``fn(data)`` or ``fn(data, ctx)`` returns a :class:`Command`.

        ``reply`` is the type of the participant's successful reply (the step's output).
        """

        def register(function: Callable[..., Command]) -> Step[D, O]:
            step_name = name or function.__name__
            if inspect.iscoroutinefunction(function):
                raise DefinitionError(
                    f"{self.name}.{step_name}: a command step's builder must be a plain function "
                    "returning command(...); use @saga.action for async local work"
                )
            return self._add_step(
                step_name,
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
    ) -> Callable[[Callable[..., Awaitable[O]]], Step[D, O]]:
        """Declare a local step: an ``async def fn(data[, ctx]) -> Output`` run by the worker.

        The output type is the function's return annotation (a msgspec-encodable type).
        """

        def register(function: Callable[..., Awaitable[O]]) -> Step[D, O]:
            step_name = name or function.__name__
            if not inspect.iscoroutinefunction(function):
                raise DefinitionError(f"{self.name}.{step_name}: an action must be an 'async def' function")
            output = self._action_output(function, f"{self.name}.{step_name}")
            return self._add_step(
                step_name,
                function,
                kind="action",
                output_type=output,
                compensate=compensate,
                retry=retry,
                timeout=timeout,
            )

        return register

    def sleep(self, name: str, duration: Duration | Callable[[D], Duration]) -> Step[D, None]:
        """Add a durable sleep step: the saga is suspended for a while or until a time.

        ``duration`` is a ``timedelta``, an aware ``datetime``, or a function of the saga's
        data returning either. The wake-up is a durable timer judged by the timer clock
        (Redis ``TIME``), so worker restarts and worker clock jumps change nothing.
        """
        check_duration(duration, f"{self.name}.{name}")
        return self._add_step(
            name,
            _no_builder,
            kind="sleep",
            output_type=None,
            compensate=None,
            retry=NO_RETRY,
            timeout=None,
            wait=Sleep(duration),
        )

    def wait_signal(
        self, name: str, *, output: type[O] | None = None, timeout: float | timedelta | None = None
    ) -> Step[D, O]:
        """Add a step that waits for a signal (a person's approval, a webhook).

        The saga is suspended until its resume token is delivered with data of type
        ``output`` (the step's output), or until ``timeout``, which fails the step and
        compensates the saga. Get the token with ``ctx.resume_token(step)`` in an earlier
        step, or from ``SagaClient.query``.
        """
        return self._add_step(
            name,
            _no_builder,
            kind="signal",
            output_type=output,
            compensate=None,
            retry=NO_RETRY,
            timeout=timeout,
            wait=SignalWait(),
        )

    def wait_event(
        self,
        name: str,
        *,
        stream: str | Stream,
        message: type[O],
        key: Callable[[O], object],
        match: Callable[[D], object],
        timeout: float | timedelta | None = None,
    ) -> Step[D, O]:
        """Add a step that waits for another context's event (choreography).

        The saga is suspended until an event of type ``message`` appears on ``stream`` with
        ``key(event) == match(data)`` (compared as strings), or until ``timeout``, which
        fails the step and compensates the saga. The event is the step's output. An event
        that comes before the saga starts waiting is kept for ``EngineConfig.event_buffer_s``
        and matched when the wait begins.
        """
        where = f"{self.name}.{name}"
        check_one_argument(key, where, "key")
        check_one_argument(match, where, "match")
        if not isinstance(message, type) or not issubclass(message, msgspec.Struct):
            raise DefinitionError(f"{where}: message must be a msgspec Struct type, not {message!r}")
        target = stream if isinstance(stream, Stream) else Stream.named(stream)
        return self._add_step(
            name,
            _no_builder,
            kind="event",
            output_type=message,
            compensate=None,
            retry=NO_RETRY,
            timeout=timeout,
            wait=EventWait(stream=target, message=message, key=key, match=match),
        )

    def compensation(
        self,
        name: str | None = None,
        *,
        retry: Retry = Retry(attempts=10, on_exhausted="dead_letter"),
        timeout: float | timedelta | None = None,
    ) -> Callable[[Builder], Compensation]:
        """Declare a compensation: a builder returning a :class:`Command`, or an async action.

        It is called as ``fn(data, ctx)``; ``ctx.output(step)`` gives the output of the step
        being undone. Compensations are retried (10 attempts by default) and dead-letter the
        saga when they keep failing; they are never swallowed.
        """

        def register(function: Builder) -> Compensation:
            comp_name = name or function.__name__
            where = f"{self.name}.{comp_name}"
            _check_name(comp_name, where)
            _check_retry(retry, where)
            if comp_name in self.compensations:
                raise DefinitionError(f"{where}: a compensation with this name is already declared")
            compensation = Compensation(
                name=comp_name,
                function=function,
                local=inspect.iscoroutinefunction(function),
                takes_context=_takes_context(function, where),
                retry=retry,
                timeout_s=_seconds(timeout, where),
                _definition=self,
            )
            self.compensations[comp_name] = compensation
            return compensation

        return register

    def _add_step(
        self,
        step_name: str,
        function: Builder,
        *,
        kind: StepKind,
        output_type: type[Any] | None,
        compensate: str | None,
        retry: Retry,
        timeout: float | timedelta | None,
        wait: WaitSpec | None = None,
        **extra: Any,
    ) -> Step[D, Any]:
        step = self._new_step(
            step_name,
            function,
            index=len(self.steps),
            kind=kind,
            output_type=output_type,
            compensate=compensate,
            retry=retry,
            timeout=timeout,
            wait=wait,
            **extra,
        )
        self.steps.append(step)
        return step

    def _branch_step(
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
        **extra: Any,
    ) -> Step[D, Any]:
        spec = group.group
        assert spec is not None  # noqa: S101 - only group steps get branches
        if spec.dynamic and spec.branches:
            raise DefinitionError(f"{self.name}.{group.name}: a map runs one branch step")
        if kind in ("child",) and spec.dynamic and name != group.name:
            raise DefinitionError(f"{self.name}.{name}: a map's child is declared with map_child")
        step = self._new_step(
            name,
            function,
            index=group.index,
            kind=kind,
            output_type=output_type,
            compensate=compensate,
            retry=retry,
            timeout=timeout,
            within=group.name,
            position=len(spec.branches),
            inputs=2 if spec.dynamic and kind != "child" else 1,
            unique=not spec.dynamic,
            **extra,
        )
        spec.branches.append(step)
        return step

    def _new_step(
        self,
        step_name: str,
        function: Builder,
        *,
        index: int,
        kind: StepKind,
        output_type: type[Any] | None,
        compensate: str | None,
        retry: Retry,
        timeout: float | timedelta | None,
        wait: WaitSpec | None = None,
        inputs: int = 1,
        unique: bool = True,
        **extra: Any,
    ) -> Step[D, Any]:
        where = f"{self.name}.{step_name}"
        _check_name(step_name, where)
        _check_retry(retry, where)
        if unique and step_name in self._names():
            raise DefinitionError(f"{where}: a step with this name is already declared")
        if output_type is not None and not _encodable(output_type):
            raise DefinitionError(f"{where}: output type {output_type!r} is not msgspec-encodable")
        return Step(
            saga=self.name,
            name=step_name,
            index=index,
            function=function,
            kind=kind,
            takes_context=_takes_context(function, where, inputs),
            output_type=output_type,
            compensate=compensate,
            retry=retry,
            timeout_s=_seconds(timeout, where),
            _definition=self,
            wait=wait,
            **extra,
        )

    def _action_output(self, function: Callable[..., Any], where: str) -> Any:
        return _return_type(function, where)

    def _names(self) -> set[str]:
        """Every step and branch name declared so far."""
        names = {s.name for s in self.steps}
        for step in self.steps:
            if step.group is not None:
                names |= {b.name for b in step.group.branches}
        return names

    def branch_steps(self) -> list[Step[D, Any]]:
        """Every branch step of every group, in declaration order."""
        return [b for s in self.steps if s.group is not None for b in s.group.branches]

    def validate(self) -> None:
        """Check what needs the whole definition; raise :class:`DefinitionError` on a mistake."""
        if not self.steps:
            raise DefinitionError(f"saga {self.name!r} has no steps")
        used = set()
        for step in [*self.steps, *self.branch_steps()]:
            where = f"{self.name}.{step.name}"
            if step.group is not None and not step.group.branches:
                raise DefinitionError(f"{where}: a {step.kind} group needs at least one branch")
            if step.child is not None:
                step.child.definition.validate()
            names = [("compensate", step.compensate)] if step.compensate else []
            if step.tcc is not None:
                names.append(("confirm", step.tcc.confirm))
            for what, name in names:
                if name not in self.compensations:
                    raise DefinitionError(
                        f"{where}: {what}={name!r} names no declared compensation "
                        f"(declared: {sorted(self.compensations) or 'none'})"
                    )
                used.add(name)
        unused = set(self.compensations) - used
        if unused:
            raise DefinitionError(f"saga {self.name!r}: compensations {sorted(unused)} undo no step")

    @property
    def takes_signals(self) -> bool:
        """Whether any step waits for a signal (then builders may make resume tokens)."""
        return any(step.kind == "signal" for step in self.steps)

    def step_named(self, name: str) -> Step[D, Any]:
        """The step called ``name`` (``KeyError`` naming the saga when there is none).

        A branch key ``<group>#<index>`` names the step that branch of the group runs; a
        branch of a ``parallel`` or ``first_of`` group is also found by its own name.
        """
        group, sep, index = name.rpartition("#")
        if sep:
            step = self.step_named(group)
            if step.group is None or not index.isdigit():
                raise KeyError(f"saga {self.key} has no branch {name!r}")
            try:
                return step.group.branch(int(index))
            except IndexError:
                raise KeyError(f"saga {self.key} has no branch {name!r}") from None
        for step in self.steps:
            if step.name == name:
                return step
        for step in self.branch_steps():  # a parallel group's branch, by its own name
            if step.name == name:
                return step
        raise KeyError(f"saga {self.key} has no step {name!r}")

    def encode_data(self, data: object) -> bytes:
        """Validate and encode start data (:class:`InvalidInput` when it is not a ``data`` type)."""
        try:
            encoded = self._encoder.encode(data)
            self._data_decoder.decode(encoded)
        except (msgspec.ValidationError, msgspec.EncodeError, TypeError) as error:
            raise InvalidInput(
                f"saga {self.key}: data is not a valid {self.data_type.__name__}: {error}"
            ) from error
        return encoded

    def decode_data(self, raw: bytes) -> D:
        """Decode stored data as the definition's data type."""
        return self._data_decoder.decode(raw)

    def __repr__(self) -> str:
        return f"Saga({self.key}, context={self.context.name}, steps={[s.name for s in self.steps]})"


def _no_builder(data: object) -> None:
    """The ``function`` of a waiting step: it builds nothing."""


def _check_name(name: str, where: str) -> None:
    if not _NAME.fullmatch(name):
        raise DefinitionError(f"{where}: invalid name (letters, digits, _ . -; at most 64)")


def _check_retry(retry: object, where: str) -> None:
    if not isinstance(retry, Retry):
        raise DefinitionError(f"{where}: retry= must be a Retry(...), not {retry!r}")


def _takes_context(function: Builder, where: str, inputs: int = 1) -> bool:
    """Check a builder's or action's signature: ``(data)`` or ``(data, ctx)``.

    A map's builder takes the item too: ``(data, item)`` or ``(data, item, ctx)``.
    """
    every = inspect.signature(function).parameters.values()
    for p in every:
        if p.kind == p.KEYWORD_ONLY and p.default is p.empty:
            raise DefinitionError(
                f"{where}: required keyword-only parameter {p.name!r} (the engine calls fn(data[, ctx]))"
            )
    parameters = [
        p for p in every if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(parameters) not in (inputs, inputs + 1):
        expected = "(data) or (data, ctx)" if inputs == 1 else "(data, item) or (data, item, ctx)"
        raise DefinitionError(f"{where}: takes {expected}, not {len(parameters)} arguments")
    return len(parameters) == inputs + 1


def invoke(target: Step[Any, Any] | Compensation, data: object, context: StepContext) -> Any:
    """Call a step's or compensation's function with the arguments it declared.

    A map's branch step also gets its item (``items(data)[branch]``); so does
    ``ctx.item`` in the branch's compensation.
    """
    index = context.branch
    if index is not None and context._item is None and target._definition is not None:
        group = target._definition.step_named(context.step.rpartition("#")[0]).group
        if group is not None and group.dynamic:
            context._item = lambda: group.items_of(data)[index]
    if isinstance(target, Step) and target.per_item:
        args: tuple[Any, ...] = (data, context.item)
    else:
        args = (data,)
    return target.function(*args, context) if target.takes_context else target.function(*args)


def _return_type(function: Builder, where: str) -> type[Any] | None:
    try:
        hints = typing.get_type_hints(function)
    except NameError as error:
        raise DefinitionError(f"{where}: cannot resolve the return annotation: {error}") from error
    if "return" not in hints:
        raise DefinitionError(f"{where}: annotate the action's return type (its output)")
    output = hints["return"]
    return None if output is type(None) else output


def _encodable(output_type: Any) -> bool:
    try:
        msgspec.json.Decoder(output_type)
    except TypeError:
        return False
    return True


def _seconds(value: float | timedelta | None, where: str) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds <= 0:
        raise DefinitionError(f"{where}: timeout must be positive")
    return seconds
