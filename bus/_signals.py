"""Graceful shutdown on SIGTERM and SIGINT for a :class:`~bus.Worker` run as a process.

The first signal asks the worker to stop: readers stop reading, in-flight handlers get
``BusConfig.shutdown_grace_s`` to finish, and whatever is left stays pending for another
worker (nothing is lost). A second signal stops at once: running handlers are cancelled
and their entries stay pending until their lease expires and another worker takes them.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Protocol

import anyio

from bus._errors import BusError
from bus._log import get_logger

DEFAULT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)
_log = get_logger("redsaga.bus")


class Stoppable(Protocol):
    """What :func:`serve` runs: a bus :class:`~bus.Worker`, a ``saga.SagaWorker``, …."""

    async def run(self) -> None:
        """Run until :meth:`stop`."""

    def stop(self) -> None:
        """Stop gracefully."""


async def serve(worker: Stoppable, signals: Sequence[signal.Signals] = DEFAULT_SIGNALS) -> None:
    """Run ``worker`` until one of ``signals`` arrives, then drain it gracefully.

    The signal handlers are installed before the worker starts, so a signal that arrives
    once ``worker.started`` is set always leads to a graceful stop. An error that stops the
    worker (:class:`~bus.RedisDataLost`, …) is raised as itself.
    """
    failure: BusError | None = None
    with anyio.open_signal_receiver(*signals) as received:
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                stopping = False
                async for signum in received:
                    if not stopping:
                        stopping = True
                        _log.info("signal received; stopping gracefully", signal=signum.name)
                        worker.stop()
                    else:
                        _log.warning("second signal; stopping now", signal=signum.name)
                        group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                await worker.run()
            except BusError as error:  # raised as itself below, not wrapped in a group
                failure = error
            group.cancel_scope.cancel()
    if failure is not None:
        raise failure
