"""An app: the sagas, participants and extra bus handlers one worker process runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from bus import Bus
from saga.core.migration import Migration
from saga.definition.context import Context
from saga.definition.rate import RateLimit
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.runtime.participant import Participant


class App:
    """What ``saga worker --app module:attr`` runs.

    Example::

        app = App("orders-service", sagas=[order_fulfilment], participants=[payments])

    Every definition is validated here, so a wrong one fails when the module is imported.
    Several versions of one saga may be served side by side; ``migrations`` are the
    :func:`~saga.migration` functions ``saga versions migrate --app`` can run.
    ``on_start`` and ``on_stop`` run around the worker (open and close databases, …).
    ``limits`` are the rate limits its orchestrators apply to the commands they send
    (:class:`~saga.RateLimit`, docs/flow-control.md).
    """

    def __init__(
        self,
        name: str,
        *,
        sagas: Iterable[Saga[Any]] = (),
        participants: Iterable[Participant] = (),
        buses: Iterable[Bus] = (),
        migrations: Iterable[Migration] = (),
        on_start: Iterable[Callable[[], Awaitable[None]]] = (),
        on_stop: Iterable[Callable[[], Awaitable[None]]] = (),
        limits: Iterable[RateLimit] = (),
    ) -> None:
        self.name = name
        self.registry = Registry(sagas, limits=limits)
        self.limits = self.registry.limits
        self.participants = list(participants)
        self.buses = list(buses)
        self.migrations = list(migrations)
        for m in self.migrations:
            if not all(d in list(self.registry) for d in (m.source, m.target)):
                raise ValueError(
                    f"app {name!r}: give it both definitions of migration {m.name} (sagas=[...])"
                )
        self.on_start = list(on_start)
        self.on_stop = list(on_stop)
        if not (len(self.registry) or self.participants or self.buses):
            raise ValueError(f"app {name!r} runs nothing: give it sagas, participants or buses")

    @property
    def contexts(self) -> list[Context]:
        """Every context this app orchestrates or whose commands its participants handle."""
        served = [*self.registry.contexts.values(), *(c for p in self.participants for c in p.serves)]
        return list(dict.fromkeys(served))

    def migration(self, name: str, source: int, target: int) -> Migration:
        """The registered migration of saga ``name`` from version ``source`` to ``target``."""
        for m in self.migrations:
            if (m.source.name, m.source.version, m.target.version) == (name, source, target):
                return m
        known = ", ".join(m.name for m in self.migrations) or "none"
        raise KeyError(f"app {self.name!r} has no migration {name}@{source}->{target} (registered: {known})")
