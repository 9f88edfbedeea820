"""A saga's steps as declared: commands, steps, compensations and what builders can read.

A :class:`Step` is what a decorator of :class:`~saga.Saga` returns and what the decider
interprets; a :class:`Compensation` undoes one (or confirms a TCC step); a builder returns a
:class:`Command` and reads the saga's progress through its :class:`StepContext`.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import msgspec

from saga.definition.retry import Retry
from saga.definition.waits import WaitSpec
from saga.errors import DefinitionError, InvalidInput, SagaError

if TYPE_CHECKING:
    from saga.definition.composition import ChildSpec, Group, GroupSpec, TccSpec
    from saga.definition.saga import Saga

D = TypeVar("D")
O = TypeVar("O")  # noqa: E741 - the conventional name for an output type variable

LOCAL: typing.Final = "_local"
"""The participant name of steps run by the orchestrator's own worker (actions)."""

NAME: typing.Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
"""Names of sagas, steps, contexts and participants (matched whole: no glob, brace or newline)."""
StepKind = Literal[
    "command", "action", "sleep", "signal", "event", "parallel", "first_of", "map", "child", "tcc"
]
"""What a step does: send a command, run a local action, wait (sleep, signal, event), run
branches (parallel, first_of, map), run a child saga, or reserve then confirm (tcc)."""
WAIT_KINDS: typing.Final = frozenset({"sleep", "signal", "event"})


def check_participant_name(name: str) -> str:
    """``name`` if a participant may have it (names starting with ``_`` are the engine's own)."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or name.startswith("_"):
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
        target = step if isinstance(step, Step) else step.group_step
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
