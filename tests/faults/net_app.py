"""A saga that touches every write path of the engine, for the network fault tests.

``charge`` (a participant command with a compensation), ``nap`` (a durable timer), ``approve``
(a signal) and ``ship`` (a second command). The participant stores each effect with its
idempotency key atomically (invariant G2, the script of ``tests/saga/nap_sagas.py``) on a
client of its own, which a test keeps off the faulty link, and may hold a handler until
the test lets it go (to keep a lease in flight across heartbeats).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

import msgspec

import bus
from saga import App, Command, CommandContext, Context, Participant, Retry, Saga, command
from tests.saga.nap_sagas import RECORD

NET = Context("net")
STEPS = ("charge", "ship")


class Order(msgspec.Struct, frozen=True):
    id: str


class Charge(msgspec.Struct, tag=True, frozen=True):
    id: str


class Refund(msgspec.Struct, tag=True, frozen=True):
    id: str


class Ship(msgspec.Struct, tag=True, frozen=True):
    id: str


class Done(msgspec.Struct, tag=True, frozen=True):
    id: str


class Approval(msgspec.Struct, frozen=True):
    by: str


RETRY = Retry(attempts=20, initial=0.05, max_delay=0.5)
net: Saga[Order] = Saga("net", context=NET, data=Order)


@net.step(reply=Done, compensate="refund", retry=RETRY)
def charge(data: Order) -> Command:
    return command("netpay", Charge(id=data.id))


@net.compensation(retry=RETRY)
def refund(data: Order) -> Command:
    return command("netpay", Refund(id=data.id))


net.sleep("nap", timedelta(milliseconds=50))
net.wait_signal("approve", output=Approval)


@net.step(reply=Done, retry=RETRY)
def ship(data: Order) -> Command:
    return command("netpay", Ship(id=data.id))


async def _go() -> None:
    return None


def app(redis: bus.Redis, hold: Callable[[], Awaitable[None]] = _go) -> App:
    """The app, its participant recording effects on ``redis``.

    ``hold`` is awaited by the ``charge`` handler before its effect.
    """
    participant = Participant("netpay", serves=[NET])

    async def apply(ctx: CommandContext) -> None:
        key = ctx.idempotency_key
        await redis.eval(RECORD, 3, f"test:runs:{key}", f"test:applied:{key}", "test:effects", key)  # type: ignore[misc]

    @participant.handles(Charge)
    async def on_charge(message: Charge, ctx: CommandContext) -> Done:
        await hold()
        await apply(ctx)
        return Done(id=message.id)

    @participant.handles(Ship)
    async def on_ship(message: Ship, ctx: CommandContext) -> Done:
        await apply(ctx)
        return Done(id=message.id)

    @participant.handles(Refund)
    async def on_refund(message: Refund, ctx: CommandContext) -> Done:
        await apply(ctx)
        return Done(id=message.id)

    return App("net-worker", sagas=[net], participants=[participant])
