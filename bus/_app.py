"""Declaring handlers and subscriptions: the :class:`Bus` is an explicit registry.

There is no process-wide registry. A service builds a ``Bus``, decorates its handlers and
hands the bus to a :class:`~bus.Worker`. Decorators validate when applied, so a wrong
declaration fails at import time with a :class:`~bus.DefinitionError` naming the handler.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from bus._auth import check_principal, stream_audience
from bus._envelope import Envelope
from bus._errors import AuthError, DefinitionError
from bus._tracing import traced
from redsaga.ids import message_type
from redsaga.streams import Stream

if TYPE_CHECKING:
    from bus._delivery import Delivery

M = TypeVar("M")
Handler = Callable[[Any, "Delivery"], Awaitable[object | None]]
BatchHandler = Callable[[list[tuple[Any, "Delivery"]]], Awaitable[Sequence[BaseException | None]]]
F = TypeVar("F", bound=Callable[..., Awaitable[object | None]])


@dataclass(frozen=True, slots=True)
class Route:
    """One handler for one message type (or for every type) within a subscription.

    A batch route's ``handler`` is a :data:`BatchHandler`: it is called once per read with
    every entry of the read it routes (see :meth:`Bus.handler`).
    """

    message_class: type[Any] | None
    handler: Handler
    name: str
    batch: bool = False

    def decode(self, envelope: Envelope) -> Any:
        """Decode the payload for this route (the whole envelope for a catch-all route)."""
        if self.message_class is None:
            return envelope
        return envelope.decode(self.message_class)


@dataclass(slots=True)
class Subscription:
    """Everything one consumer group on one stream does.

    Attributes:
        stream: Where entries are read from.
        group: The consumer group; each group sees every entry once.
        start_id: Where a newly created group starts: ``$`` (new entries) or ``0``.
        idempotent: Whether handlers are deduped by idempotency key (first result kept).
        ignore_unknown: Acknowledge entries of types without a route (subscriptions)
            instead of dead-lettering them (command handlers).
        routes: Handlers by message type name; ``None`` maps the catch-all route.
        principal: Who handles the entries (``participant:payments``): the audience of a
            command stream, and the signer of the replies and follow-ups its handlers make.
        audience: Whose MAC the entries carry: the ``principal`` itself for a command
            stream, ``stream:<key>`` for a broadcast stream (see ``bus/_auth.py``).
        senders: The principals that may write the stream (``None``: any that signs).
        bounded_letters: Whether each principal's dead letters are bounded per window
            (``BusConfig.letter_quota``): for a stream that many principals write.

    """

    stream: Stream
    group: str
    start_id: str
    idempotent: bool
    ignore_unknown: bool
    principal: str
    audience: str
    senders: frozenset[str] | None = None
    routes: dict[str | None, Route] = field(default_factory=dict)
    bounded_letters: bool = False

    def route_for(self, type_name: str) -> Route | None:
        """The route for ``type_name``, else the catch-all route, else ``None``."""
        return self.routes.get(type_name) or self.routes.get(None)


class Bus:
    """A registry of message handlers and subscriptions for one service.

    Example::

        bus = Bus("payments")

        @bus.handler("payments", ChargeCard)
        async def charge(command: ChargeCard, delivery: Delivery) -> CardCharged:
            ...

        @bus.subscribe("orders.events", group="shipping", messages=[OrderPlaced])
        async def on_order(event: OrderPlaced) -> None:
            ...
    """

    def __init__(self, name: str, *, principal: str | None = None) -> None:
        if not name:
            raise DefinitionError("a Bus needs a name (the service or context it belongs to)")
        self.name = name
        self.principal = principal or f"service:{name}"
        """Who this bus's handlers act as, unless a handler names another (``bus/_auth.py``)."""
        self._subscriptions: dict[tuple[Stream, str], Subscription] = {}

    @property
    def subscriptions(self) -> list[Subscription]:
        """Every subscription declared so far."""
        return list(self._subscriptions.values())

    def handler(
        self,
        stream: str | Stream,
        message: type[Any] | None,
        *,
        group: str | None = None,
        idempotent: bool = True,
        batch: bool = False,
        principal: str | None = None,
        senders: Iterable[str] | None = None,
        bounded_letters: bool = False,
    ) -> Callable[[F], F]:
        """Register a command handler for ``message`` on ``stream``.

        The handler may return a reply message; it is published to the command's
        ``reply_to`` stream atomically with the acknowledgement. Entries of a type with no
        handler are dead-lettered. ``group`` defaults to the bus's name. With ``message``
        ``None`` the handler receives every entry's :class:`~bus.Envelope` undecoded.

        With ``batch``, the handler is called once per read with the list of its
        ``(message, delivery)`` pairs, on one task, and returns one outcome per pair, in
        order: ``None`` when the entry was handled (acknowledged by the handler's own script,
        :meth:`~bus.Delivery.mark_acked`, else completed without a reply), or the exception
        that entry failed with (classified as a single handler's would be). Such a handler
        is not cancelled when a lease is lost: it must look at ``delivery.scope.cancel_called``
        before it acts for an entry, and its writes must be fenced by the lease (as the saga
        orchestrator's transitions are). For handlers whose per-entry work is short and
        whose writes batch well; a raise fails every entry of the call.

        With signing on (``bus/_auth.py``), entries must be signed for ``principal`` (the
        bus's by default), and by one of ``senders`` when given; replies are signed by
        ``principal`` for whoever signed the command. With ``bounded_letters``, each
        principal's dead letters are bounded per window (``BusConfig.letter_quota``): for a
        stream many principals write, such as a saga inbox.
        """
        who = principal or self.principal

        def register(function: F) -> F:
            self._add(
                _stream(stream),
                group or self.name,
                [message],
                function,
                start_id="0",
                idempotent=idempotent,
                ignore_unknown=False,
                batch=batch,
                principal=who,
                audience=who,
                senders=senders,
                bounded_letters=bounded_letters,
            )
            return function

        return register

    def subscribe(
        self,
        stream: str | Stream,
        *,
        group: str,
        messages: Iterable[type[Any]] | None = None,
        from_beginning: bool = False,
        idempotent: bool = True,
        principal: str | None = None,
        senders: Iterable[str] | None = None,
    ) -> Callable[[F], F]:
        """Subscribe ``group`` to the events on ``stream`` (choreography).

        With ``messages``, the handler receives the decoded message and other types are
        acknowledged and skipped; without, it receives every :class:`~bus.Envelope`. A new
        group starts at new entries unless ``from_beginning``. With signing on, events must
        be signed for the stream (``stream:<key>``), by one of ``senders`` when given.
        """
        target = _stream(stream)

        def register(function: F) -> F:
            classes: list[type[Any] | None] = list(messages) if messages is not None else [None]
            self._add(
                target,
                group,
                classes,
                function,
                start_id="0" if from_beginning else "$",
                idempotent=idempotent,
                ignore_unknown=True,
                principal=principal or self.principal,
                audience=stream_audience(target.key),
                senders=senders,
            )
            return function

        return register

    def _add(
        self,
        stream: Stream,
        group: str,
        classes: list[type[Any] | None],
        function: Callable[..., Awaitable[object | None]],
        *,
        start_id: str,
        idempotent: bool,
        ignore_unknown: bool,
        principal: str,
        audience: str,
        senders: Iterable[str] | None,
        batch: bool = False,
        bounded_letters: bool = False,
    ) -> None:
        name = getattr(function, "__qualname__", repr(function))
        handler = _batch_handler(function, name) if batch else traced(_normalise(function, name))
        try:
            check_principal(principal)
            allowed = None if senders is None else frozenset(check_principal(s) for s in senders)
        except AuthError as error:
            raise DefinitionError(f"{name}: {error}") from error
        subscription = self._subscriptions.setdefault(
            (stream, group),
            Subscription(stream, group, start_id, idempotent, ignore_unknown, principal, audience, allowed),
        )
        options = (subscription.idempotent, subscription.ignore_unknown, subscription.principal)
        if options != (idempotent, ignore_unknown, principal) or subscription.senders != allowed:
            raise DefinitionError(
                f"{name}: group {group!r} on {stream} is already declared with other options",
            )
        subscription.bounded_letters |= bounded_letters
        for message_class in classes:
            type_name = None if message_class is None else message_type(message_class)
            if type_name in subscription.routes:
                taken = subscription.routes[type_name].name
                raise DefinitionError(
                    f"{name}: {type_name or 'every message'} on {stream} for group {group!r} "
                    f"is already handled by {taken}",
                )
            subscription.routes[type_name] = Route(message_class, handler, name, batch)


def _stream(stream: str | Stream) -> Stream:
    return stream if isinstance(stream, Stream) else Stream.named(stream)


def _positional_parameters(function: Callable[..., Awaitable[object | None]], name: str) -> int:
    """How many positional parameters without defaults a coroutine function takes."""
    if not inspect.iscoroutinefunction(function):
        raise DefinitionError(f"{name}: a handler must be an 'async def' function")
    return sum(
        1
        for p in inspect.signature(function).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )


def _batch_handler(function: Callable[..., Awaitable[object | None]], name: str) -> Any:
    """Check a batch handler's shape: ``async def f(batch)``."""
    parameters = _positional_parameters(function, name)
    if parameters != 1:
        raise DefinitionError(f"{name}: a batch handler takes (batch), not {parameters} arguments")
    return function


def _normalise(function: Callable[..., Awaitable[object | None]], name: str) -> Handler:
    """Check a handler's shape and return it as ``(message, delivery) -> awaitable``."""
    parameters = _positional_parameters(function, name)
    if parameters == 1:

        async def one_argument(message: Any, _delivery: Delivery) -> object | None:
            return await function(message)

        return one_argument
    if parameters == 2:
        return function
    raise DefinitionError(
        f"{name}: a handler takes (message) or (message, delivery), not {parameters} arguments",
    )
