"""Participant fakes for :mod:`saga.testing`: one behaviour per outcome a saga must survive.

A :class:`FakeParticipant` answers each command type with a :class:`Behaviour`. Behaviours
are built with the factories below and compose through ``then=``::

    payments = FakeParticipant("payments", {
        ChargeCard: fail_transiently(times=2, then=succeed(CardCharged(charge_id="c1", amount_cents=100))),
        RefundCard: succeed(lambda cmd: CardRefunded(refund_id=f"r-{cmd.charge_id}")),
    })

A behaviour decides two things per delivery: what the handler does (return an output,
raise :class:`~bus.PermanentError`, raise a transient error, or nothing at all) and how the
reply travels (once, twice, late, or the command is delivered again). The handler's outcome
becomes a reply through the same code a real participant's handler goes through
(``saga.runtime.step_reply.reply_for``), so a fake fails and succeeds exactly like production code.

Counting behaviours (``fail_transiently(times=2)``, ``late_reply(times=1)``, ...) count
per idempotency key, that is per step and kind of one saga, over the deliveries that reach
them. The runner puts the bus's idempotent consumer in front of every participant (as
production does): once a handler succeeded or failed permanently, later deliveries with the
same key are answered with that first result and do not reach the behaviour.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import msgspec

from bus import PermanentError, TransientError, message_type
from saga.runtime.participant import CommandContext, Participant

Handler: TypeAlias = Callable[[Any, CommandContext], Awaitable[Any]]
"""A participant's handler: ``async def fn(command, ctx) -> output``."""

CallOutcome = Literal["ok", "transient", "permanent", "lost", "replayed"]


@dataclass(frozen=True, slots=True)
class Call:
    """One command delivered to a participant (fake or real) by the runner.

    Attributes:
        participant: The participant's name.
        message: The decoded command.
        saga_id: The saga that sent it.
        step: The step it belongs to.
        kind: ``"do"`` for the step, ``"undo"`` for its compensation.
        attempt: The attempt number (from 1) of that step or compensation.
        command_id: The command's id (a reply names it as its cause).
        idempotency_key: The key participants dedupe on: ``<saga id>:<step>:<kind>``.
        at_ms: Virtual time of the delivery.
        outcome: ``"ok"`` (the handler ran and succeeded: its effect happened),
            ``"transient"`` / ``"permanent"`` (the handler failed), ``"lost"`` (the
            participant never answered this delivery) or ``"replayed"`` (the idempotent
            consumer answered with the key's first result without running the handler).

    """

    participant: str
    message: Any
    saga_id: str
    step: str
    kind: str
    attempt: int
    command_id: str
    idempotency_key: str
    at_ms: int
    outcome: CallOutcome

    @property
    def applied(self) -> bool:
        """Whether this delivery ran the handler to success (its effect happened)."""
        return self.outcome == "ok"


@dataclass(frozen=True, slots=True)
class Response:
    """What a behaviour decided for one delivery (the runner carries it out).

    Attributes:
        handler: Runs the command; ``None`` means the participant never answers it.
        copies: How many times the reply is sent (2: a duplicate reply).
        late: The reply is held back until the saga has given up on that attempt
            (timed out or moved on), then delivered.
        redeliver: The command is delivered once more after this delivery (a consumer that
            crashed before acknowledging it).

    """

    handler: Handler | None
    copies: int = 1
    late: bool = False
    redeliver: bool = False


Respond: TypeAlias = Callable[[Any, CommandContext], Response]


class Behaviour:
    """How a fake participant answers one type of command; build one with the factories.

    ``then`` (on the factories that take it) is what happens once the behaviour has done its
    part; left ``None``, it is the behaviour registered before for the same command type
    (see :meth:`FakeParticipant.on`).
    """

    __slots__ = ("_bind", "_describe", "_respond")

    def __init__(self, describe: str, bind: Callable[[Behaviour | None], Respond]) -> None:
        self._describe = describe
        self._bind = bind
        self._respond: Respond | None = None

    def bound(self, previous: Behaviour | None) -> Behaviour:
        """A ready copy of this behaviour whose missing ``then`` is ``previous``."""
        copy = Behaviour(self._describe, self._bind)
        copy._respond = self._bind(previous)
        return copy

    def respond(self, command: Any, ctx: CommandContext) -> Response:
        """Decide what happens to one delivery of ``command``."""
        if self._respond is None:
            self._respond = self._bind(None)
        return self._respond(command, ctx)

    def __repr__(self) -> str:
        return self._describe


BehaviourLike: TypeAlias = "Behaviour | msgspec.Struct | Callable[..., Any]"
"""A :class:`Behaviour`, or an output message / function accepted as ``succeed(...)``."""


def as_behaviour(value: Behaviour | msgspec.Struct | Callable[..., Any]) -> Behaviour:
    """Accept a behaviour, a reply message or an output function (``succeed(value)``)."""
    return value if isinstance(value, Behaviour) else succeed(value)


def _resolve(then: Behaviour | None, previous: Behaviour | None, what: str) -> Behaviour:
    chosen = then if then is not None else previous
    if chosen is None:
        raise ValueError(f"{what}: give then=..., or register a behaviour for this command type first")
    return chosen.bound(previous)


def succeed(output: msgspec.Struct | Callable[..., Any] | None = None) -> Behaviour:
    """Reply with ``output``: a message, or a function of the command that returns it.

    The function is ``fn(command)`` or ``fn(command, ctx)`` (a
    :class:`~saga.CommandContext`), sync or async; like a real handler it may raise
    :class:`~bus.PermanentError` (the step fails for good) or any other exception (a
    transient failure). A command step's reply must be of the step's ``reply=`` type; a
    compensation may reply with anything, ``None`` included.
    """
    if output is None or isinstance(output, msgspec.Struct):
        fixed = output

        async def constant(_command: Any, _ctx: CommandContext) -> Any:
            return fixed

        handler: Handler = constant
        name = "succeed()" if output is None else f"succeed({type(output).__name__})"
    else:
        handler = _handler_of(output)
        name = f"succeed({getattr(output, '__name__', 'fn')})"
    return Behaviour(name, lambda _previous: lambda _command, _ctx: Response(handler))


def handler(function: Handler) -> Behaviour:
    """Run a real participant handler, ``async def fn(command, ctx)``."""
    return Behaviour(
        f"handler({getattr(function, '__qualname__', 'fn')})",
        lambda _previous: lambda _command, _ctx: Response(function),
    )


def fail(error: str | BaseException = "failed permanently") -> Behaviour:
    """Fail every delivery: with a message, :class:`~bus.PermanentError` (the step fails for good).

    Give an exception instance to raise that instead (a ``PermanentError`` subclass fails
    for good, any other exception is transient unless its class name is in the step's
    ``Retry(non_retryable=...)``).
    """
    raiser = _raiser(error, PermanentError)
    return Behaviour(f"fail({error!r})", lambda _previous: lambda _c, _x: Response(raiser))


def fail_transiently(
    times: int = 1,
    *,
    then: Behaviour | None = None,
    error: str | BaseException = "temporarily unavailable",
) -> Behaviour:
    """Fail the first ``times`` deliveries of each idempotency key transiently, then ``then``."""
    _positive(times, "fail_transiently")
    raiser = _raiser(error, TransientError)

    def bind(previous: Behaviour | None) -> Respond:
        after = _resolve(then, previous, "fail_transiently(...)")
        seen: Counter[str] = Counter()

        def respond(command: Any, ctx: CommandContext) -> Response:
            seen[ctx.idempotency_key] += 1
            if seen[ctx.idempotency_key] <= times:
                return Response(raiser)
            return after.respond(command, ctx)

        return respond

    return Behaviour(f"fail_transiently({times}, then={then!r})", bind)


def no_reply(times: int | None = None, *, then: Behaviour | None = None) -> Behaviour:
    """Never answer (``times=None``) or ignore the first ``times`` deliveries of each key.

    The handler does not run, so nothing happens at the participant: use it with a step
    ``timeout=`` to exercise timeouts (an unanswered attempt counts as a transient failure).
    """
    if times is None:
        return Behaviour("no_reply()", lambda _previous: lambda _c, _x: Response(None))
    _positive(times, "no_reply")

    def bind(previous: Behaviour | None) -> Respond:
        after = _resolve(then, previous, "no_reply(times=...)")
        seen: Counter[str] = Counter()

        def respond(command: Any, ctx: CommandContext) -> Response:
            seen[ctx.idempotency_key] += 1
            if seen[ctx.idempotency_key] <= times:
                return Response(None)
            return after.respond(command, ctx)

        return respond

    return Behaviour(f"no_reply({times}, then={then!r})", bind)


def late_reply(then: Behaviour | None = None, *, times: int = 1) -> Behaviour:
    """Run the command (per ``then``) but hold its reply until the saga gave up on the attempt.

    The first ``times`` deliveries of each key reply late: the effect happens at once, the
    reply arrives only after the attempt timed out or a later attempt was sent. The saga
    must record that reply as late and ignore it. Later deliveries reply on time.
    """
    _positive(times, "late_reply")
    return _modifier(f"late_reply(then={then!r}, times={times})", then, times, late=True)


def duplicate_reply(then: Behaviour | None = None, *, times: int | None = None) -> Behaviour:
    """Reply twice to each of the first ``times`` deliveries of each key (``None``: all)."""
    return _modifier(f"duplicate_reply(then={then!r})", then, times, copies=2)


def redeliver(then: Behaviour | None = None, *, times: int = 1) -> Behaviour:
    """Deliver the command a second time after the first ``times`` deliveries of each key.

    This is what a consumer that crashed after handling a command, before acknowledging it,
    causes; the idempotent consumer answers the repeat with the first result.
    """
    _positive(times, "redeliver")
    return _modifier(f"redeliver(then={then!r}, times={times})", then, times, redeliver=True)


def sequence(*behaviours: BehaviourLike) -> Behaviour:
    """Use the n-th behaviour for the n-th delivery of each key; the last one repeats.

    Example: ``sequence(fail_transiently(), no_reply(), succeed(reply))``.
    """
    if not behaviours:
        raise ValueError("sequence() needs at least one behaviour")
    parts = [as_behaviour(b) for b in behaviours]

    def bind(previous: Behaviour | None) -> Respond:
        ready = [part.bound(previous) for part in parts]
        seen: Counter[str] = Counter()

        def respond(command: Any, ctx: CommandContext) -> Response:
            index = min(seen[ctx.idempotency_key], len(ready) - 1)
            seen[ctx.idempotency_key] += 1
            return ready[index].respond(command, ctx)

        return respond

    return Behaviour(f"sequence{tuple(parts)!r}", bind)


class FakeParticipant:
    """A participant for :class:`~saga.testing.SagaRunner` that answers per :class:`Behaviour`.

    ``behaviours`` maps each command type the participant receives to a behaviour (or to a
    reply message or an output function, meaning ``succeed(...)``). Every delivered command
    is recorded in :attr:`calls` with its idempotency key, so a test can assert what was
    sent, in which order, and that each effect happened once.

    With ``idempotent=False`` the runner does not put the idempotent consumer in front of
    this participant: every delivery reaches the behaviour (to show what a participant
    without dedupe would do).
    """

    def __init__(
        self,
        name: str,
        behaviours: Mapping[type[Any], BehaviourLike] | None = None,
        *,
        idempotent: bool = True,
    ) -> None:
        self.name = name
        self.idempotent = idempotent
        self.calls: list[Call] = []
        self._behaviours: dict[type[Any], Behaviour] = {}
        for message, behaviour in (behaviours or {}).items():
            self.on(message, behaviour)

    @classmethod
    def of(cls, participant: Participant) -> FakeParticipant:
        """Wrap a real :class:`~saga.Participant`: its handlers run, and calls are recorded.

        Override one command type to inject faults around the real handler, e.g.
        ``fake.on(ChargeCard, fail_transiently(times=2))`` fails twice, then runs it.
        """
        fake = cls(participant.name)
        for registered in participant._handlers:  # same package: the runner calls them directly
            fake.on(registered.message, handler(registered.function))
        return fake

    def on(self, message: type[Any], behaviour: BehaviourLike) -> FakeParticipant:
        """Answer ``message`` commands with ``behaviour`` (its ``then=None`` is the previous one)."""
        if not isinstance(message, type):
            raise TypeError(f"on() takes a command type, got {message!r}")
        self._behaviours[message] = as_behaviour(behaviour).bound(self._behaviours.get(message))
        return self

    def behaviour(self, type_name: str) -> tuple[type[Any], Behaviour] | None:
        """The command class and behaviour registered for the wire type ``type_name``."""
        for message, behaviour in self._behaviours.items():
            if message_type(message) == type_name:
                return message, behaviour
        return None

    @property
    def handles(self) -> list[type[Any]]:
        """The command types this fake answers."""
        return list(self._behaviours)

    def received(self, message: type[Any] | None = None) -> list[Any]:
        """Every command delivered (of type ``message``), repeats included, in order."""
        return [c.message for c in self.calls if message is None or type(c.message) is message]

    def effects(self, message: type[Any] | None = None) -> list[Call]:
        """The deliveries whose handler ran and succeeded (of type ``message``), in order."""
        return [c for c in self.calls if c.applied and (message is None or type(c.message) is message)]

    def assert_each_effect_once(self) -> None:
        """Fail unless no idempotency key had its effect applied more than once."""
        counts = Counter(c.idempotency_key for c in self.effects())
        twice = sorted(key for key, n in counts.items() if n > 1)
        if twice:
            raise AssertionError(f"participant {self.name!r} applied these effects more than once: {twice}")

    def __repr__(self) -> str:
        return f"FakeParticipant({self.name!r}, {self._behaviours!r})"


def _modifier(
    name: str,
    then: Behaviour | None,
    times: int | None,
    *,
    copies: int = 1,
    late: bool = False,
    redeliver: bool = False,
) -> Behaviour:
    def bind(previous: Behaviour | None) -> Respond:
        inner = _resolve(then, previous, name)
        seen: Counter[str] = Counter()

        def respond(command: Any, ctx: CommandContext) -> Response:
            response = inner.respond(command, ctx)
            seen[ctx.idempotency_key] += 1
            if times is not None and seen[ctx.idempotency_key] > times:
                return response
            return Response(
                response.handler,
                copies=max(response.copies, copies),
                late=response.late or late,
                redeliver=response.redeliver or redeliver,
            )

        return respond

    return Behaviour(name, bind)


def _handler_of(function: Callable[..., Any]) -> Handler:
    """Adapt ``fn(command)`` / ``fn(command, ctx)``, sync or async, to a handler."""
    parameters = [
        p
        for p in inspect.signature(function).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(parameters) not in (1, 2):
        raise TypeError(f"{function!r}: an output function takes (command) or (command, ctx)")
    takes_context = len(parameters) == 2

    async def run(command: Any, ctx: CommandContext) -> Any:
        result = function(command, ctx) if takes_context else function(command)
        return await result if inspect.isawaitable(result) else result

    return run


def _raiser(error: str | BaseException, kind: type[Exception]) -> Handler:
    """A handler that raises ``kind(error)`` (a fresh one each time) or the given exception."""

    async def run(_command: Any, _ctx: CommandContext) -> Any:
        raise kind(error) if isinstance(error, str) else error

    return run


def _positive(times: int, what: str) -> None:
    if times < 1:
        raise ValueError(f"{what}: times must be at least 1")


def participants_of(values: Iterable[Participant | FakeParticipant]) -> dict[str, FakeParticipant]:
    """Index participants by name, wrapping real ones with :meth:`FakeParticipant.of`."""
    indexed: dict[str, FakeParticipant] = {}
    for value in values:
        fake = value if isinstance(value, FakeParticipant) else FakeParticipant.of(value)
        if fake.name in indexed:
            raise ValueError(f"two participants are named {fake.name!r}")
        indexed[fake.name] = fake
    return indexed
