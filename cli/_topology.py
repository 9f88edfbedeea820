"""What a ``saga worker --app X`` process reads: each stream, its consumer group, and for whom.

The list is taken from a worker built for the App (nothing is connected or run), so a
health check or an autoscaler's configuration names exactly the streams and groups the
worker itself consumes: every partition's inbox and local-action stream of each context the
App orchestrates, every partition's command stream of each participant, every subscription.
"""

from __future__ import annotations

import msgspec

import bus
from redsaga.cli._common import CommandError
from redsaga.cli._load import load_object
from saga import App, EngineConfig, SagaWorker


class Read(msgspec.Struct, frozen=True, kw_only=True):
    """One consumer group a worker reads.

    Attributes:
        stream: The stream's Redis key (``rs:{orders:0}:cmd:payments``).
        group: The consumer group (``payments``; ``orchestrator`` for an inbox).
        principal: Who handles its entries (``participant:payments``, ``orchestrator:orders``).

    """

    stream: str
    group: str
    principal: str


def load_app(reference: str | None) -> App:
    """The App named by ``--app`` (or ``$REDSAGA_APP``); a one-line error otherwise."""
    if not reference:
        raise CommandError("name the worker's app: --app module:attribute (or set REDSAGA_APP)")
    app = load_object(reference)
    if not isinstance(app, App):
        raise CommandError(f"{reference} is a {type(app).__name__}, not a saga.App")
    return app


def worker_reads(app: App) -> list[Read]:
    """Every consumer group a worker of ``app`` reads, in the worker's order."""
    # Signing off: only the names are wanted, and whoever asks need not hold the keyrings.
    worker = SagaWorker(None, app, config=EngineConfig(auth=bus.Authenticator()))
    return [
        Read(stream=c.sub.stream.key, group=c.sub.group, principal=c.sub.principal)
        for c in worker.bus_worker.consumers
    ]
