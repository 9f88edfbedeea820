"""A small shop saga on the README's messages whose outcome its order id chooses, and the one
place tests build its worker and clients (a change in how an embedded worker or client is
made goes here only).

``o-…`` completes; ``declined-…`` fails at the first step (nothing to undo); ``nowhere-…``
fails at shipping and is compensated (the charge refunded); ``flaky-…`` fails shipping
transiently until its single attempt runs out: dead-lettered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from anyio.from_thread import start_blocking_portal

import bus
from examples.checkout import Charge, Charged, Order, Refund, Ship, Shipped
from saga import (
    App,
    CommandContext,
    EngineConfig,
    Participant,
    PermanentError,
    Retry,
    Saga,
    SagaClient,
    SagaWorker,
    StepContext,
    SyncSagaClient,
    TransientError,
    command,
)

checkout = Saga("checkout", version=1, context="shop", data=Order)


@checkout.step(reply=Charged, compensate="refund")
def charge(order: Order) -> Any:
    return command("payments", Charge(order_id=order.id, amount=order.amount))


@checkout.compensation()
def refund(order: Order, ctx: StepContext) -> Any:
    return command("payments", Refund(charge_id=ctx.output(charge).charge_id))


@checkout.step(reply=Shipped, retry=Retry(attempts=1))
def ship(order: Order) -> Any:
    return command("shipping", Ship(order_id=order.id))


payments = Participant("payments", serves=["shop"])
shipping = Participant("shipping", serves=["shop"])


@payments.handles(Charge)
async def take_payment(command: Charge, ctx: CommandContext) -> Charged:
    if command.order_id.startswith("declined-"):
        raise PermanentError("card declined")
    return Charged(charge_id=f"ch-{command.order_id}")


@payments.handles(Refund)
async def give_back(command: Refund, ctx: CommandContext) -> Charged:
    return Charged(charge_id=command.charge_id)


@shipping.handles(Ship)
async def book_carrier(command: Ship, ctx: CommandContext) -> Shipped:
    if command.order_id.startswith("nowhere-"):
        raise PermanentError("no carrier for this address")
    if command.order_id.startswith("flaky-"):
        raise TransientError("carrier down")
    return Shipped(tracking=f"T-{command.order_id}")


app = App("shop", sagas=[checkout], participants=[payments, shipping])
CONFIG = EngineConfig(bus=bus.BusConfig(block_ms=200))
"""Short blocking reads, so that a worker stopped by a test returns soon."""


def embedded(redis: Any) -> tuple[SagaWorker, SagaClient]:
    """A worker running the shop on ``redis``, and a client of it."""
    return SagaWorker(redis, app, config=CONFIG), SagaClient(redis, app.registry, config=CONFIG)


def synced(connect: Callable[[], Any]) -> SyncSagaClient:
    """A synchronous client of the shop whose Redis client ``connect`` builds."""
    return SyncSagaClient(app.registry, config=CONFIG, connect=connect)


@contextmanager
def worker_thread(connect: Callable[[], Any]) -> Iterator[SagaWorker]:
    """A shop worker running in a thread of its own (as beside a WSGI server) until the block ends."""
    with start_blocking_portal() as portal:
        worker = portal.call(_worker, connect)
        portal.start_task_soon(_run, worker)
        try:
            yield worker
        finally:
            portal.call(worker.stop)


async def _worker(connect: Callable[[], Any]) -> SagaWorker:
    return embedded(connect())[0]


async def _run(worker: SagaWorker) -> None:
    try:
        await worker.run()
    finally:
        await worker.redis.aclose()
