"""Declaring sagas: steps, compensations, retry policies and timeouts.

A definition is a :class:`Saga` plus its steps, in declaration order. Decorators check what
they can when applied (signatures, duplicate names, types) and :meth:`Saga.validate`, run
when the definition is registered with an app, a client or a test runner, checks what needs
the whole definition (every ``compensate=`` names a compensation, every compensation is
used). Errors are :class:`~saga.DefinitionError` naming the saga and the step.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

import msgspec

from bus import Stream, message_type
from saga._errors import DefinitionError, InvalidInput, SagaError
from saga._wait_steps import (
    Duration,
    EventWait,
    SignalWait,
    Sleep,
    WaitSpec,
    check_duration,
    check_one_argument,
)

D = TypeVar("D")
O = TypeVar("O")  # noqa: E741 - the conventional name for an output type variable

LOCAL: typing.Final = "_local"
"""The participant name of steps run by the orchestrator's own worker (actions)."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
StepKind = Literal["command", "action", "sleep", "signal", "event"]
"""What a step does: send a command, run a local action, or wait (sleep, signal, event)."""
WAIT_KINDS: typing.Final = frozenset({"sleep", "signal", "event"})


@dataclass(frozen=True, slots=True)
class Retry:
    """How a step (or a compensation) is retried after transient failures and timeouts.

    Attributes:
        attempts: Total attempts, the first included (1 = no retry).
        initial: Delay before the second attempt, in seconds.
        backoff: Each further delay is the previous one times this.
        max_delay: Longest delay, in seconds.
        jitter: Fraction of each delay that is randomised (deterministically per saga,
            step and attempt, so replay decides the same).
        non_retryable: Error type names that fail the step at once (as the participant's
            exception class name, e.g. ``"CardDeclined"``).
        on_exhausted: What happens when attempts run out: ``"dead_letter"`` parks the saga
            for an operator (DESIGN.md §3), ``"compensate"`` treats it as a permanent failure.

    """

    attempts: int = 3
    initial: float = 1.0
    backoff: float = 2.0
    max_delay: float = 60.0
    jitter: float = 0.2
    non_retryable: tuple[str, ...] = ()
    on_exhausted: Literal["dead_letter", "compensate"] = "dead_letter"

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("Retry.attempts must be at least 1")
        if self.initial < 0 or self.max_delay < 0 or self.backoff < 1:
            raise ValueError("Retry delays must be >= 0 and backoff >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("Retry.jitter is a fraction between 0 and 1")

    def delay_ms(self, failed_attempt: int, seed: str) -> int:
        """Delay before the attempt after ``failed_attempt`` (deterministic jitter from ``seed``)."""
        base = min(self.max_delay, self.initial * self.backoff ** max(0, failed_attempt - 1))
        digest = hashlib.blake2b(f"{seed}:{failed_attempt}".encode(), digest_size=8).digest()
        fraction = int.from_bytes(digest, "big") / 2**64
        return int(base * (1 - self.jitter * fraction) * 1000)


NO_RETRY: typing.Final = Retry(attempts=1)


@dataclass(frozen=True, slots=True)
class Command:
    """A command for a participant: what a command step's builder returns."""

    participant: str
    message: object

    def __post_init__(self) -> None:
        if not _NAME.match(self.participant) or self.participant == LOCAL:
            raise DefinitionError(f"invalid participant name {self.participant!r}")
        if not isinstance(self.message, msgspec.Struct):
            raise DefinitionError(
                f"a command's message must be a msgspec Struct, got {type(self.message).__name__}"
            )


def command(participant: str, message: object) -> Command:
    """Build the command that a step sends to ``participant`` (its stream in this context)."""
    return Command(participant, message)


class StepContext:
    """What a step's builder or action can read besides the saga's data."""

    def __init__(
        self,
        saga_id: str,
        step: str,
        attempt: int,
        outputs: dict[str, bytes],
        tokens: Callable[[str], str] | None = None,
    ) -> None:
        self.saga_id = saga_id
        self.step = step
        self.attempt = attempt
        self._outputs = outputs
        self._tokens = tokens

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

    def output(self, step: Step[Any, O]) -> O:
        """The output of an earlier step that succeeded, decoded as that step's output type."""
        raw = self._outputs.get(step.name)
        if raw is None:
            raise KeyError(f"step {step.name!r} has no output (it has not succeeded)")
        return step.decode_output(raw)

    @property
    def idempotency_key(self) -> str:
        """The key participants dedupe this step on (stable across retries and redeliveries)."""
        return f"{self.saga_id}:{self.step}"


Builder = Callable[..., Any]


@dataclass(frozen=True, eq=False, slots=True)
class Compensation:
    """How to undo a step: a command builder or a local async action."""

    name: str
    function: Builder
    local: bool
    takes_context: bool
    retry: Retry
    timeout_s: float | None


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

    @property
    def local(self) -> bool:
        """Whether the step is a local action (run by the orchestrator's worker)."""
        return self.kind == "action"

    @property
    def waits(self) -> bool:
        """Whether the step waits (sleep, signal or event) instead of sending a command."""
        return self.kind in WAIT_KINDS

    def decode_output(self, raw: bytes) -> O:
        """Decode a recorded output (``InvalidInput`` when it does not match the type)."""
        if self.output_type is None:
            return typing.cast(O, None)
        try:
            return msgspec.json.decode(raw, type=self.output_type)
        except msgspec.ValidationError as error:
            raise InvalidInput(
                f"{self.saga}.{self.name}: output is not a valid {self.output_type.__name__}: {error}"
            ) from error

    @property
    def compensation(self) -> Compensation | None:
        """The registered compensation, if the step has one."""
        return self._definition.compensations.get(self.compensate) if self.compensate else None

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
        if not _NAME.match(self.name) or ":" in self.name:
            raise DefinitionError(f"invalid context name {self.name!r}")
        if not 1 <= self.partitions <= 1024:
            raise DefinitionError(f"context {self.name!r}: partitions must be between 1 and 1024")


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
        if not _NAME.match(name) or "@" in name:
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
            output = _return_type(function, f"{self.name}.{step_name}")
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
    ) -> Step[D, Any]:
        where = f"{self.name}.{step_name}"
        _check_name(step_name, where)
        _check_retry(retry, where)
        if any(s.name == step_name for s in self.steps):
            raise DefinitionError(f"{where}: a step with this name is already declared")
        if output_type is not None and not _encodable(output_type):
            raise DefinitionError(f"{where}: output type {output_type!r} is not msgspec-encodable")
        step: Step[D, Any] = Step(
            saga=self.name,
            name=step_name,
            index=len(self.steps),
            function=function,
            kind=kind,
            takes_context=_takes_context(function, where),
            output_type=output_type,
            compensate=compensate,
            retry=retry,
            timeout_s=_seconds(timeout, where),
            _definition=self,
            wait=wait,
        )
        self.steps.append(step)
        return step

    def validate(self) -> None:
        """Check what needs the whole definition; raise :class:`DefinitionError` on a mistake."""
        if not self.steps:
            raise DefinitionError(f"saga {self.name!r} has no steps")
        used = set()
        for step in self.steps:
            if step.compensate is None:
                continue
            if step.compensate not in self.compensations:
                raise DefinitionError(
                    f"{self.name}.{step.name}: compensate={step.compensate!r} names no declared "
                    f"compensation (declared: {sorted(self.compensations) or 'none'})"
                )
            used.add(step.compensate)
        unused = set(self.compensations) - used
        if unused:
            raise DefinitionError(f"saga {self.name!r}: compensations {sorted(unused)} undo no step")

    @property
    def takes_signals(self) -> bool:
        """Whether any step waits for a signal (then builders may make resume tokens)."""
        return any(step.kind == "signal" for step in self.steps)

    def step_named(self, name: str) -> Step[D, Any]:
        """The step called ``name`` (``KeyError`` naming the saga when there is none)."""
        for step in self.steps:
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


def reply_type_name(message_class: type[Any]) -> str:
    """The wire type name a participant's reply of this class carries."""
    return message_type(message_class)


def _no_builder(data: object) -> None:
    """The ``function`` of a waiting step: it builds nothing."""


def _check_name(name: str, where: str) -> None:
    if not _NAME.match(name):
        raise DefinitionError(f"{where}: invalid name (letters, digits, _ . -; at most 64)")


def _check_retry(retry: object, where: str) -> None:
    if not isinstance(retry, Retry):
        raise DefinitionError(f"{where}: retry= must be a Retry(...), not {retry!r}")


def _takes_context(function: Builder, where: str) -> bool:
    """Check a builder's or action's signature: ``(data)`` or ``(data, ctx)``."""
    every = inspect.signature(function).parameters.values()
    for p in every:
        if p.kind == p.KEYWORD_ONLY and p.default is p.empty:
            raise DefinitionError(
                f"{where}: required keyword-only parameter {p.name!r} (the engine calls fn(data[, ctx]))"
            )
    parameters = [
        p for p in every if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(parameters) not in (1, 2):
        raise DefinitionError(f"{where}: takes (data) or (data, ctx), not {len(parameters)} arguments")
    return len(parameters) == 2


def invoke(target: Step[Any, Any] | Compensation, data: object, context: StepContext) -> Any:
    """Call a step's or compensation's function with the arguments it declared."""
    return target.function(data, context) if target.takes_context else target.function(data)


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
