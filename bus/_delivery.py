"""What a handler is told about the entry it handles, and how it keeps its lease."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from bus._envelope import Envelope
from bus._errors import BusError
from redsaga.ids import derived_id
from redsaga.streams import Stream

if TYPE_CHECKING:
    from bus._publisher import Publisher
    from bus._scripts import CommandCall, ScriptCall


class LeaseLost(BusError):
    """This consumer no longer holds the entry (its lease expired and another took it over).

    The handler must stop: its result would be refused. Raised by
    :meth:`Delivery.heartbeat`; the worker also cancels a handler whose lease it finds lost.
    """


class HandlerScope:
    """Cancels the task that runs a handler, from anywhere, once its lease is lost.

    The worker enters it around the handler; :meth:`cancel` (called by the lease keeper when
    a heartbeat finds the lease taken over) cancels the handler at its current ``await``,
    and leaving the scope swallows that one cancellation. It follows ``asyncio.timeout``'s
    protocol (one ``Task.cancel`` matched by one ``Task.uncancel``), so it composes with
    anyio's cancel scopes: a cancellation from elsewhere (worker shutdown) still propagates.
    It costs a fraction of an ``anyio.CancelScope``, which matters once per delivery.
    """

    __slots__ = ("_cancelling", "_requested", "_task", "cancel_called")

    def __init__(self) -> None:
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._requested = False
        self.cancel_called = False

    def __enter__(self) -> HandlerScope:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - the bus runs only inside asyncio tasks
            raise RuntimeError("a HandlerScope must be entered inside an asyncio task")
        self._task, self._cancelling = task, task.cancelling()
        return self

    def cancel(self) -> None:
        """Stop the handler at its current ``await`` (a handler not started yet is not run).

        Called from the handler's own task (a heartbeat it made found the lease lost), the
        cancellation is delivered once the handler next waits, like an anyio cancel scope's;
        if the handler leaves the scope first, nothing is left pending on the task.
        """
        if self.cancel_called:
            return
        self.cancel_called = True
        task = self._task
        if task is None:
            return
        if task is asyncio.current_task():
            task.get_loop().call_soon(self._deliver, task)
        else:
            self._deliver(task)

    def _deliver(self, task: asyncio.Task[Any]) -> None:
        if self._task is task and not self._requested:  # still inside the scope
            self._requested = True
            task.cancel()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        task, self._task = self._task, None
        if task is None or not self._requested:
            return False
        # ours is swallowed only if no other cancellation is pending on the task
        return task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError


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
        dedupe_key: The key the handler is deduped on, when it is: its record is a field of
            the group's dedupe hash (``Stream.dedupe_key``).
        principal: Who signed the entry, checked (``""`` with signing off; in ``log``
            mode the signer it names, checked or not: see ``bus/_auth.py``).
        handler_principal: Who the handler acts as: the signer of its follow-ups.

    """

    envelope: Envelope
    stream: Stream
    group: str
    entry_id: str
    deliveries: int
    consumer: str
    dedupe_key: str | None = None
    principal: str = ""
    handler_principal: str = ""
    last_beat_ms: int = 0
    scope: HandlerScope = field(default_factory=HandlerScope)
    acked_by_handler: bool = False
    _beat: Callable[[Delivery], Awaitable[bool]] | None = None
    _publisher: Publisher | None = None
    _call: Callable[..., Awaitable[Any]] | None = None
    _call_many: Callable[..., Awaitable[list[Any]]] | None = None
    _published: int = 0

    def mark_acked(self) -> None:
        """Tell the worker that the handler's own script acknowledged the entry.

        For handlers that commit their state and the acknowledgement in one script (the
        saga orchestrator): the worker then only frees the slot.
        """
        self.acked_by_handler = True

    async def call(self, call: ScriptCall | CommandCall, *, retry: bool = True) -> Any:
        """Run a script call (or a read) in the worker's next pipelined batch; return its result.

        Concurrent handlers' calls share round trips; a per-call error is raised here. A
        call that cannot reach Redis is retried with back-off until it can (script calls
        are idempotent), unless ``retry`` is false: then :class:`~bus.RedisUnavailable` is
        raised at once.
        """
        if self._call is None:
            raise BusError("this delivery is not attached to a worker")
        return await self._call(call, retry=retry)

    async def call_many(self, calls: Sequence[ScriptCall | CommandCall], *, retry: bool = True) -> list[Any]:
        """Run ``calls`` in the worker's next pipelined batch; return their results in order.

        For a batch handler's writes (see :meth:`bus.Bus.handler`): one wait for all of
        them. A failed call's result is its :class:`~bus.BusError`, returned, not raised.
        """
        if self._call_many is None:
            raise BusError("this delivery is not attached to a worker")
        return await self._call_many(calls, retry=retry)

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
            signer=self.handler_principal or None,
        )
