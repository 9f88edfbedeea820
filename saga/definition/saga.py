"""Declaring sagas: the :class:`Saga`.

A definition is a :class:`Saga` plus its steps, in declaration order. Decorators check what
they can when applied (signatures, duplicate names, types) and :meth:`Saga.validate`, run
when the definition is registered with an app, a client or a test runner, checks what needs
the whole definition (every ``compensate=`` names a compensation, every compensation is
used). Errors are :class:`~saga.DefinitionError` naming the saga and the step (as fields and
in the message).

The pieces a saga is declared with are composed, each in its own module: its bounded
context (``context.py``), the steps and what builders read (``step.py``), the decorator core
that makes and checks every step and branch (``declare.py``), the composed steps -- groups,
maps, child sagas, TCC (``composition.py``) -- and the waits (``waits.py``). This module
also names the definition's types for the layers that use them (``__all__``).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Generic, TypeVar

import msgspec

from redsaga.streams import Stream
from saga.definition.composition import Composer, Group
from saga.definition.concurrency import Key
from saga.definition.context import Context, parent_contexts
from saga.definition.declare import (
    Declarations,
    action_step,
    check_name,
    check_retry,
    check_whole,
    command_step,
    no_builder,
    seconds,
    takes_context,
)
from saga.definition.human_tasks import declare_human_task, declare_quorum_task
from saga.definition.retry import NO_RETRY, Retry
from saga.definition.step import (
    LOCAL,
    NAME,
    Builder,
    Command,
    Compensation,
    Step,
    StepContext,
    StepKind,
    check_participant_name,
    command,
    invoke,
)
from saga.definition.step_index import StepIndex
from saga.definition.waits import (
    Duration,
    EventWait,
    SignalWait,
    Sleep,
    check_duration,
    check_one_argument,
)
from saga.definition.where import Where
from saga.errors import DefinitionError, InvalidInput

__all__ = [
    "LOCAL",
    "Command",
    "Compensation",
    "Context",
    "Saga",
    "Step",
    "StepContext",
    "StepKind",
    "check_participant_name",
    "command",
    "invoke",
]

D = TypeVar("D")
O = TypeVar("O")  # noqa: E741 - the conventional name for an output type variable
T = TypeVar("T")


class Saga(Generic[D]):
    """A saga definition: a name, a version, a bounded context, typed data and ordered steps.

    Example::

        orders = Saga("order_fulfilment", version=1, context="orders", data=Order)

        @orders.step(reply=StockReserved, compensate="release_stock")
        def reserve_stock(data: Order) -> Command:
            return command("inventory", ReserveStock(order_id=data.id, items=data.items))

        @orders.compensation()
        def release_stock(data: Order, ctx: StepContext) -> Command:
            return command("inventory", ReleaseStock(order_id=data.id))

    ``parents`` names the other contexts whose sagas run this one as a child step: only
    their orchestrators may start it (and cancel it) here, when the worker does not have
    their definitions to tell (``saga/definition/lineage.py``).
    """

    def __init__(
        self,
        name: str,
        *,
        data: type[D],
        version: int = 1,
        context: str | Context = "default",
        deadline: timedelta | None = None,
        concurrency: Key | None = None,
        parents: Sequence[str] | None = None,
    ) -> None:
        if not NAME.fullmatch(name) or "@" in name:
            raise DefinitionError(f"invalid saga name {name!r} (letters, digits, _ . -)")
        if version < 1:
            raise DefinitionError("version must be a positive integer", saga=name)
        self.name = name
        self.version = version
        self.context = context if isinstance(context, Context) else Context(context)
        self.data_type = data
        self.deadline_s = seconds(deadline, Where(name), "deadline")
        """Seconds from the start after which an unfinished saga is compensated (``None``: never)."""
        self.concurrency = None if concurrency is None else concurrency.named(name)
        """At most ``limit`` sagas per value of this key run at once (saga/definition/concurrency.py)."""
        self.parents = parent_contexts(parents, self.context, name)
        """The other contexts whose sagas may start this one as a child (``None``: undeclared;
        saga/definition/lineage.py)."""
        self.steps: list[Step[D, Any]] = []
        self.compensations: dict[str, Compensation] = {}
        self._index = StepIndex(self.steps, self.branch_steps)
        self._encoder = msgspec.json.Encoder()
        try:
            self._data_decoder = msgspec.json.Decoder(data)
        except TypeError as error:
            raise DefinitionError(f"data type {data!r} is not msgspec-decodable", saga=name) from error
        self._declared = Declarations(self)
        self._composer = Composer(self, self._declared)

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
        return command_step(
            self.name,
            self._declared.add,
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
        """Declare a local step: an ``async def fn(data[, ctx]) -> Output`` run by the worker.

        The output type is the function's return annotation (a msgspec-encodable type).
        """
        return action_step(
            self.name, self._declared.add, compensate=compensate, retry=retry, timeout=timeout, name=name
        )

    def sleep(self, name: str, duration: Duration | Callable[[D], Duration]) -> Step[D, None]:
        """Add a durable sleep step: the saga is suspended for a while or until a time.

        ``duration`` is a ``timedelta``, an aware ``datetime``, or a function of the saga's
        data returning either. The wake-up is a durable timer judged by the timer clock
        (Redis ``TIME``), so worker restarts and worker clock jumps change nothing.
        """
        check_duration(duration, Where(self.name, name))
        return self._declared.add(
            name,
            no_builder,
            kind="sleep",
            output_type=None,
            compensate=None,
            retry=NO_RETRY,
            timeout=None,
            wait=Sleep(duration),
        )

    human_task = declare_human_task
    """Add a human task (``saga/definition/human_tasks.py``): a typed answer from a person."""
    quorum_task = declare_quorum_task
    """Add a k-of-n task (``saga/definition/human_tasks.py``): ``quorum`` of the voters say yes."""

    def wait_signal(
        self, name: str, *, output: type[O] | None = None, timeout: float | timedelta | None = None
    ) -> Step[D, O]:
        """Add a step that waits for a signal (a person's approval, a webhook).

        The saga is suspended until its resume token is delivered with data of type
        ``output`` (the step's output), or until ``timeout``, which fails the step and
        compensates the saga. Get the token with ``ctx.resume_token(step)`` in an earlier
        step, or from ``SagaClient.query``.
        """
        return self._declared.add(
            name,
            no_builder,
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
        where = Where(self.name, name)
        check_one_argument(key, where, "key")
        check_one_argument(match, where, "match")
        if not isinstance(message, type) or not issubclass(message, msgspec.Struct):
            raise where.error(f"message must be a msgspec Struct type, not {message!r}")
        target = stream if isinstance(stream, Stream) else Stream.named(stream)
        return self._declared.add(
            name,
            no_builder,
            kind="event",
            output_type=message,
            compensate=None,
            retry=NO_RETRY,
            timeout=timeout,
            wait=EventWait(stream=target, message=message, key=key, match=match),
        )

    # -- composed steps (saga/definition/composition.py) ---------------------------------

    def parallel(self, name: str, *, concurrency: int | None = None) -> Group[D]:
        """Add a fan-out/fan-in group: its branches run side by side, all must succeed.

        Add branches with the group's ``step``, ``action`` and ``child``. At most
        ``concurrency`` run at once (the next starts as one completes). If a branch fails
        for good, no further branch starts, the ones in flight are awaited (an attempt in
        flight may take effect, so its outcome decides), and every completed branch -- then
        every earlier step -- is compensated, in reverse order of completion.
        """
        return self._composer.parallel(name, concurrency=concurrency)

    def first_of(self, name: str, *, concurrency: int | None = None) -> Group[D]:
        """Add a first-of-N group: the first branch to succeed wins; the step fails if all fail.

        When a branch wins, no further branch starts; the others in flight are awaited (child
        sagas among them are cancelled), and those that completed anyway are compensated
        before the saga moves on, so nothing but the winner's effect stays.
        """
        return self._composer.first_of(name, concurrency=concurrency)

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
        return self._composer.map(
            items=items,
            reply=reply,
            compensate=compensate,
            concurrency=concurrency,
            limit=limit,
            retry=retry,
            timeout=timeout,
            name=name,
        )

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
        return self._composer.map_child(
            name,
            saga=saga,
            items=items,
            data=data,
            concurrency=concurrency,
            limit=limit,
            compensate=compensate,
        )

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
        return self._composer.child(name, saga=saga, data=data, compensate=compensate)

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
        return self._composer.tcc(
            reply=reply,
            confirm=confirm,
            cancel=cancel,
            expires=expires,
            retry=retry,
            timeout=timeout,
            name=name,
        )

    # -- compensations ---------------------------------------------------------------------

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
            where = Where(self.name, comp_name)
            check_name(comp_name, where)
            check_retry(retry, where)
            if comp_name in self.compensations:
                raise where.error("a compensation with this name is already declared")
            compensation = Compensation(
                name=comp_name,
                function=function,
                local=inspect.iscoroutinefunction(function),
                takes_context=takes_context(function, where),
                retry=retry,
                timeout_s=seconds(timeout, where),
                _definition=self,
            )
            self.compensations[comp_name] = compensation
            return compensation

        return register

    def branch_steps(self) -> list[Step[D, Any]]:
        """Every branch step of every group, in declaration order."""
        return [b for s in self.steps if s.group is not None for b in s.group.branches]

    def validate(self) -> None:
        """Check what needs the whole definition; raise :class:`DefinitionError` on a mistake."""
        check_whole(self)

    @property
    def takes_signals(self) -> bool:
        """Whether any step waits for a signal (then builders may make resume tokens)."""
        return self._index.takes_signals

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
        found = self._index.find(name)  # a parallel group's branch is also found by its own name
        if found is not None:
            return found
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
