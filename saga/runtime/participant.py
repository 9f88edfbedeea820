"""Participants: services that receive a saga's commands and reply.

A participant declares typed handlers; it consumes the ``cmd:<name>`` stream of every
partition of the contexts it serves, with the bus's leases, dead letters and idempotent
consumption (a redelivered command, or a retry with the same idempotency key, gets the first
result without running the handler again). Its reply goes back to the partition's inbox in
the same script that acknowledges the command.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

from bus import Bus, Delivery, Envelope, Reply
from saga.definition.saga import Context, check_participant_name
from saga.errors import DefinitionError
from saga.runtime.protocol import StepFailed
from saga.runtime.tracing import traced_reply
from saga.store.keys import Partition
from saga.store.trust import orchestrator_of, participant_named

M = TypeVar("M")
R = TypeVar("R")
CommandHandler = Callable[[Any, "CommandContext"], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class CommandContext:
    """What a participant's handler knows about the command it handles."""

    saga_id: str
    step: str
    kind: str
    attempt: int
    idempotency_key: str
    delivery: Delivery
    envelope: Envelope
    """The command's envelope (headers carry trace context). An outbox handler's also names
    this worker in ``replied-by``, which the reply written to the outbox carries over, so the
    saga's history says who replied as it does for replies sent on the bus."""

    async def heartbeat(self) -> None:
        """Extend the lease on this command (only needed by handlers that block the loop)."""
        await self.delivery.heartbeat()

    @classmethod
    def of(cls, delivery: Delivery, *, outbox: bool = False) -> CommandContext:
        """The context of the command ``delivery`` carries (the saga's headers say which step)."""
        envelope = delivery.envelope
        if outbox:
            headers = {**envelope.headers, "replied-by": delivery.consumer}
            envelope = msgspec.structs.replace(envelope, headers=headers)
        return cls(
            saga_id=envelope.correlation_id,
            step=envelope.headers.get("step", ""),
            kind=envelope.headers.get("kind", ""),
            attempt=envelope.attempt,
            idempotency_key=envelope.idempotency_key,
            delivery=delivery,
            envelope=envelope,
        )


@dataclass(frozen=True, slots=True)
class _Handler(Generic[M]):
    message: type[M]
    function: CommandHandler
    outbox: bool


class Participant:
    """A service's command handlers for the contexts it serves.

    Example::

        payments = Participant("payments", serves=["orders"])

        @payments.handles(ChargeCard)
        async def charge(command: ChargeCard, ctx: CommandContext) -> CardCharged:
            ...  # raise PermanentError("card declined") to fail the step for good
    """

    def __init__(self, name: str, *, serves: Iterable[str | Context]) -> None:
        self.name = check_participant_name(name)
        self.serves = [c if isinstance(c, Context) else Context(c) for c in serves]
        if not self.serves:
            raise DefinitionError(f"participant {name!r} serves no context")
        self._handlers: list[_Handler[Any]] = []

    def handles(
        self, message: type[M], *, outbox: bool = False
    ) -> Callable[[Callable[[M, CommandContext], Awaitable[R]]], Callable[[M, CommandContext], Awaitable[R]]]:
        """Register the handler of ``message`` commands: ``async def fn(command, ctx) -> output``.

        With ``outbox=True`` the handler keeps its state in its own database: it records the
        command in the relay's inbox, applies its change and writes its reply to the outbox
        in one transaction (``relay.inbox.receive`` / ``reply`` / ``resend``), and returns
        nothing; the relay publishes the reply once the transaction commits. Deduplication
        is then the inbox's, in the database, instead of the bus's. A failure it raises is
        still replied on the bus (nothing was committed).
        """

        def register(
            function: Callable[[M, CommandContext], Awaitable[R]],
        ) -> Callable[[M, CommandContext], Awaitable[R]]:
            if any(h.message is message for h in self._handlers):
                raise DefinitionError(f"participant {self.name!r} already handles {message.__name__}")
            self._handlers.append(_Handler(message, function, outbox))
            return function

        return register

    @property
    def uses_outbox(self) -> bool:
        """Whether a handler replies through the outbox (then the relay publishes its replies)."""
        return any(h.outbox for h in self._handlers)

    def install(self, bus: Bus, serves: Callable[[int], bool] = lambda _index: True) -> None:
        """Register this participant's handlers on ``bus`` for every partition it serves.

        ``serves`` picks the partition indexes (``EngineConfig.serves``; default: all).
        """
        if not self._handlers:
            raise DefinitionError(f"participant {self.name!r} handles no command")
        me = participant_named(self.name)
        for context in self.serves:
            senders = [orchestrator_of(context.name)]  # its commands come from that orchestrator only
            for index in filter(serves, range(context.partitions)):
                stream = Partition(context.name, index).commands(self.name)
                for handler in self._handlers:
                    register = bus.handler(
                        stream,
                        handler.message,
                        group=self.name,
                        idempotent=not handler.outbox,
                        principal=me,
                        senders=senders,
                    )
                    register(_adapt(handler.function, outbox=handler.outbox))


def _adapt(function: CommandHandler, *, outbox: bool) -> Callable[[Any, Delivery], Awaitable[Any]]:
    async def handle(message: Any, delivery: Delivery) -> Any:
        context = CommandContext.of(delivery, outbox=outbox)
        reply = await traced_reply(delivery.envelope, function(message, context), wrap=False)
        if outbox and not isinstance(reply, StepFailed | Reply):
            return None  # success: the handler's own transaction put the reply in the outbox
        return reply

    handle.__qualname__ = getattr(function, "__qualname__", "handler")
    return handle
