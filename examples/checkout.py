"""The README's complete example: a two-step checkout saga with a compensation."""

import anyio
import msgspec

from bus import connect
from saga import (
    App,
    CommandContext,
    Participant,
    PermanentError,
    Saga,
    SagaClient,
    SagaWorker,
    StepContext,
    command,
)


class Order(msgspec.Struct):
    id: str
    amount: int


class Charge(msgspec.Struct, tag=True):
    order_id: str
    amount: int


class Charged(msgspec.Struct, tag=True):
    charge_id: str


class Refund(msgspec.Struct, tag=True):
    charge_id: str


class Ship(msgspec.Struct, tag=True):
    order_id: str


class Shipped(msgspec.Struct, tag=True):
    tracking: str


checkout = Saga("checkout", version=1, context="shop", data=Order)


@checkout.step(reply=Charged, compensate="refund")
def charge(order: Order):
    return command("payments", Charge(order_id=order.id, amount=order.amount))


@checkout.compensation()
def refund(order: Order, ctx: StepContext):
    return command("payments", Refund(charge_id=ctx.output(charge).charge_id))


@checkout.step(reply=Shipped)
def ship(order: Order):
    return command("shipping", Ship(order_id=order.id))


payments = Participant("payments", serves=["shop"])
shipping = Participant("shipping", serves=["shop"])


@payments.handles(Charge)
async def take_payment(command: Charge, ctx: CommandContext) -> Charged:
    return Charged(charge_id=f"ch-{ctx.idempotency_key}")  # same key on every retry


@payments.handles(Refund)
async def give_back(command: Refund, ctx: CommandContext) -> Charged:
    return Charged(charge_id=command.charge_id)


@shipping.handles(Ship)
async def book_carrier(command: Ship, ctx: CommandContext) -> Shipped:
    if command.order_id == "o2":
        raise PermanentError("no carrier for this address")  # -> refund, then compensated
    return Shipped(tracking="T-1")


app = App("shop", sagas=[checkout], participants=[payments, shipping])


async def main() -> None:
    redis = connect()  # $REDSAGA_REDIS_URL, else an embedded in-memory Redis
    worker, client = SagaWorker(redis, app), SagaClient(redis, app.registry)
    for order in (Order(id="o1", amount=100), Order(id="o2", amount=50)):
        await client.start(checkout, order, saga_id=order.id)  # idempotent per id
    await worker.run_until_idle()  # in a service: `saga worker --app module:app`
    for saga_id in ("o1", "o2"):
        print(saga_id, (await client.get(saga_id)).status)  # o1 completed, o2 compensated


if __name__ == "__main__":
    anyio.run(main)
