"""What a handler is told about the entry it handles, and how it keeps its lease."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from bus._envelope import Envelope
from bus._errors import BusError
from bus._ids import derived_id
from bus._keys import Stream

if TYPE_CHECKING:
    from bus._publisher import Publisher
    from bus._scripts import ScriptCall


class LeaseLost(BusError):
    """This consumer no longer holds the entry (its lease expired and another took it over).

    The handler must stop: its result would be refused. Raised by
    :meth:`Delivery.heartbeat`; the worker also cancels a handler whose lease it finds lost.
    """


@dataclass(eq=False, slots=True, kw_only=True)
class Delivery:
    """One delivery of one stream entry to one handler.

    Attributes:
        envelope: The decoded envelope.
        stream: The stream the entry came from.
        group: The consumer group it was delivered to.
        entry_id: The stream entry id.
        deliveries: How many times Redis has handed this entry out (1 on first delivery).
        consumer: The consumer (worker) that holds the lease.
        dedupe_key: The idempotency key's Redis key, when the handler is deduped.

    """

    envelope: Envelope
    stream: Stream
    group: str
    entry_id: str
    deliveries: int
    consumer: str
    dedupe_key: str | None = None
    last_beat_ms: int = 0
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    acked_by_handler: bool = False
    _beat: Callable[[Delivery], Awaitable[bool]] | None = None
    _publisher: Publisher | None = None
    _call: Callable[[ScriptCall], Awaitable[Any]] | None = None
    _published: int = 0

    def mark_acked(self) -> None:
        """Tell the worker that the handler's own script acknowledged the entry.

        For handlers that commit their state and the acknowledgement in one script (the
        saga orchestrator): the worker then only frees the slot.
        """
        self.acked_by_handler = True

    async def call(self, call: ScriptCall) -> Any:
        """Run a script call in the worker's next pipelined batch and return its result.

        Concurrent handlers' calls share round trips; a per-call error is raised here.
        """
        if self._call is None:
            raise BusError("this delivery is not attached to a worker")
        return await self._call(call)

    async def heartbeat(self) -> None:
        """Extend the lease now; raise :class:`LeaseLost` if another consumer took it over.

        The worker heartbeats in-flight entries on its own every ``BusConfig.heartbeat_ms``;
        call this only in a handler that blocks the event loop for long stretches.
        """
        if self._beat is not None and not await self._beat(self):
            raise LeaseLost(f"lease on {self.stream}/{self.entry_id} was taken over")

    async def publish(self, stream: str | Stream, message: object) -> str | None:
        """Publish a follow-up message caused by this one (choreography).

        Its id derives from this entry and the call's position in the handler, so a
        redelivered handler that publishes the same follow-ups adds no duplicates within
        the publish dedupe window. Correlation, causation and headers are carried over.
        """
        if self._publisher is None:
            raise BusError("this delivery cannot publish (no publisher attached)")
        self._published += 1
        target = stream if isinstance(stream, Stream) else Stream.named(stream)
        return await self._publisher.publish(
            target,
            message,
            correlation_id=self.envelope.correlation_id,
            causation_id=self.envelope.id,
            headers=self.envelope.headers,
            message_id=derived_id(self.envelope.id, f"{target.key}#{self._published}"),
        )
