"""The order generator: starts one order saga every few seconds, until stopped.

``python -m redsaga.examples.generator --every 2`` keeps the example system busy (the
compose file's ``generator`` service). Orders are drawn like the demo's (declined cards,
unserved regions, flaky participants, orders above the approval limit that run
``large_order`` and wait for a manager), each with a new id. SIGTERM or SIGINT stops it
cleanly: a start in flight finishes, no new one begins, and it exits 0 after logging how
many orders it started. While Redis is unreachable it logs each failed start and tries the
same order again at the next tick (a start with the same saga id is idempotent).
"""

from __future__ import annotations

import random
import signal
from typing import Annotated

import anyio
import structlog
import typer

import bus
from bus import BusError, Clock, SystemClock, uuid7
from redsaga.examples.contracts import Order
from redsaga.examples.demo import draw_order
from redsaga.examples.orders import app as orders_app
from redsaga.examples.orders import saga_for
from saga import SagaClient, SagaError

_log = structlog.get_logger("redsaga.generator")


class OrderGenerator:
    """Starts an order every ``every_s`` seconds of ``clock`` until :meth:`stop` (or ``limit``)."""

    def __init__(
        self,
        client: SagaClient,
        *,
        every_s: float,
        seed: int | None = None,
        limit: int | None = None,
        clock: Clock | None = None,
    ) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, not {every_s}")
        self.client = client
        self.every_s = every_s
        self.limit = limit
        self.started = 0
        """Orders started so far."""
        self.run_id = uuid7()[:13]
        """Keeps this run's order ids apart from every other run's."""
        self._rng = random.Random(seed)
        self._clock = clock or SystemClock()
        self._stopping = anyio.Event()

    def stop(self) -> None:
        """Stop after the start in flight, if any; a pause in between ends at once."""
        self._stopping.set()

    async def run(self) -> int:
        """Start orders until stopped or ``limit`` is reached; return how many were started."""
        order = self._next()
        while not self._stopping.is_set() and (self.limit is None or self.started < self.limit):
            try:
                saga_id = await self.client.start(saga_for(order), order, saga_id=order.id)
            except BusError as error:
                if not error.retryable:
                    raise
                _log.warning("could not start an order; trying it again", saga_id=order.id, error=str(error))
            else:
                self.started += 1
                _log.info("order started", saga_id=saga_id, started=self.started)
                order = self._next()
            if self.limit is None or self.started < self.limit:
                await self._pause()
        return self.started

    def _next(self) -> Order:
        return draw_order(self._rng, f"order-gen-{self.run_id}-{self.started:06d}")

    async def _pause(self) -> None:
        """Wait ``every_s`` on the clock, or until :meth:`stop`, whichever comes first."""
        async with anyio.create_task_group() as tasks:

            async def tick() -> None:
                await self._clock.sleep(self.every_s)
                tasks.cancel_scope.cancel()

            tasks.start_soon(tick)
            await self._stopping.wait()
            tasks.cancel_scope.cancel()


def main(
    every: Annotated[float, typer.Option(min=0.001, help="Seconds between two orders.")] = 2.0,
    count: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many orders (default: run until SIGTERM).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the order draw (default: random).")] = None,
    redis_url: Annotated[
        str | None,
        typer.Option("--redis-url", envvar=bus.URL_ENV, help="Redis URL (required).", show_default=False),
    ] = None,
) -> None:
    """Start an order-fulfilment saga every --every seconds until SIGTERM or SIGINT.

    Logs one JSON line per order on stderr. Exit codes: 0 stopped cleanly (or --count
    reached), 1 no Redis URL, or an error that retrying will not fix, 2 bad usage.
    """
    from redsaga.cli._logging import configure  # noqa: PLC0415 - the CLI's JSON logs, as the workers log

    configure(json_logs=True)
    url = bus.resolve_url(redis_url)
    if url.startswith(bus.MEMORY_URL):
        typer.secho(
            f"error: the generator starts orders on a real Redis: pass --redis-url or set {bus.URL_ENV}",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)

    async def run() -> int:
        redis = bus.connect(url)
        client = SagaClient(redis, orders_app.registry, source="generator")
        generator = OrderGenerator(client, every_s=every, seed=seed, limit=count)
        failed: list[BusError | SagaError] = []  # raised below as itself, not in a task group's group
        try:
            async with anyio.create_task_group() as tasks:

                async def stop_on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                        async for _ in signals:
                            generator.stop()

                tasks.start_soon(stop_on_signal)
                try:
                    await generator.run()
                except (BusError, SagaError) as error:
                    failed.append(error)
                tasks.cancel_scope.cancel()
        finally:
            await redis.aclose()
        if failed:
            raise failed[0]
        _log.info("generator stopped", started=generator.started)
        return generator.started

    try:
        anyio.run(run)
    except (BusError, SagaError) as error:
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from error


if __name__ == "__main__":
    typer.run(main)
