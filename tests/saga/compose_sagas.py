"""Composed sagas for the composition tests: groups, maps, first-of-N, children, TCC.

One participant, ``worker``, does every piece of work; what it does with a piece (succeed,
fail for good, fail a few times, or keep quiet) is decided by the saga's :class:`Plan` and
the piece's name, so the same plan runs the same way on the in-process runner and on Redis.
Every effect is logged with its idempotency key (:class:`Services`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import msgspec

from bus import PermanentError, TransientError
from saga import Command, CommandContext, Participant, Retry, Saga, StepContext, command

CONTEXT = "compose"
RETRY = Retry(attempts=3, initial=1.0, backoff=2.0, max_delay=4.0, jitter=0.0)
UNDO_RETRY = Retry(attempts=5, initial=1.0, backoff=1.0, max_delay=1.0, jitter=0.0)


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """What a saga does: its items, and which pieces fail (by piece name)."""

    id: str
    items: list[str] = msgspec.field(default_factory=list)
    fail: list[str] = msgspec.field(default_factory=list)
    """Pieces that fail for good."""
    flaky: dict[str, int] = msgspec.field(default_factory=dict)
    """Pieces that fail transiently this many times first."""
    cancel_on: list[str] = msgspec.field(default_factory=list)
    """Pieces whose handler asks to cancel the saga before it answers (a fraud check)."""
    nap: int = 0
    """Seconds the TCC saga sleeps between its reservation and its payment."""
    undo_fail: list[str] = msgspec.field(default_factory=list)
    """Pieces whose undo fails for good."""
    confirm_fail: list[str] = msgspec.field(default_factory=list)
    """TCC pieces whose confirmation fails for good."""


class Work(msgspec.Struct, tag=True, frozen=True):
    piece: str
    saga: str
    plan: Plan


class Worked(msgspec.Struct, tag=True, frozen=True):
    piece: str


class Revert(msgspec.Struct, tag=True, frozen=True):
    piece: str
    plan: Plan


class Confirm(msgspec.Struct, tag=True, frozen=True):
    piece: str
    plan: Plan


def work(piece: str, data: Plan, saga: str = "") -> Command:
    return command("worker", Work(piece=piece, saga=saga, plan=data))


def revert(piece: str, data: Plan) -> Command:
    return command("worker", Revert(piece=piece, plan=data))


# -- fan-out/fan-in and a map ----------------------------------------------------------------

fan: Saga[Plan] = Saga("fan", context=CONTEXT, data=Plan)


@fan.step(reply=Worked, compensate="undo_prepare", retry=RETRY, timeout=10)
def prepare(data: Plan) -> Command:
    return work("prepare", data)


book = fan.parallel("book", concurrency=2)


@book.step(reply=Worked, compensate="undo_flight", retry=RETRY, timeout=10)
def flight(data: Plan, ctx: StepContext) -> Command:
    assert ctx.branch == 0
    return work("flight", data)


@book.step(reply=Worked, compensate="undo_hotel", retry=RETRY, timeout=10)
def hotel(data: Plan) -> Command:
    return work("hotel", data)


@book.step(reply=Worked, retry=RETRY, timeout=10)
def car(data: Plan) -> Command:
    return work("car", data)


@fan.map(
    items=lambda plan: plan.items,
    reply=Worked,
    compensate="undo_item",
    concurrency=3,
    limit=50,
    retry=RETRY,
    timeout=10,
)
def item(data: Plan, name: str, ctx: StepContext) -> Command:
    assert ctx.item == name
    return work(f"item-{name}", data)


@fan.step(reply=Worked, retry=RETRY, timeout=10)
def finish(data: Plan, ctx: StepContext) -> Command:
    assert ctx.output(flight) == Worked(piece="flight")
    assert ctx.output(book)["hotel"] == {"type": "Worked", "piece": "hotel"}
    assert [w.piece for w in ctx.output(item)] == [f"item-{n}" for n in data.items]
    return work("finish", data)


@fan.compensation(retry=UNDO_RETRY, timeout=10)
def undo_prepare(data: Plan, ctx: StepContext) -> Command:
    return revert(ctx.output(prepare).piece, data)


@fan.compensation(retry=UNDO_RETRY, timeout=10)
def undo_flight(data: Plan, ctx: StepContext) -> Command:
    return revert(ctx.output(flight).piece, data)


@fan.compensation(retry=UNDO_RETRY, timeout=10)
def undo_hotel(data: Plan, ctx: StepContext) -> Command:
    return revert(ctx.output(hotel).piece, data)


@fan.compensation(retry=UNDO_RETRY, timeout=10)
def undo_item(data: Plan, ctx: StepContext) -> Command:
    assert ctx.branch_output(item).piece == f"item-{ctx.item}"
    return revert(f"item-{ctx.item}", data)


# -- first-of-N --------------------------------------------------------------------------------

race: Saga[Plan] = Saga("race", context=CONTEXT, data=Plan)
quote = race.first_of("quote", concurrency=2)


def _quoter(name: str) -> None:
    def builder(data: Plan) -> Command:
        return work(name, data)

    quote.step(reply=Worked, compensate=f"undo_{name}", retry=RETRY, timeout=10, name=name)(builder)

    def undo(data: Plan) -> Command:
        return revert(name, data)

    race.compensation(f"undo_{name}", retry=UNDO_RETRY, timeout=10)(undo)


for _name in ("cheap", "fast", "fancy"):
    _quoter(_name)


@race.step(reply=Worked, retry=RETRY, timeout=10)
def accept(data: Plan, ctx: StepContext) -> Command:
    return work(f"accept-{ctx.output(quote).piece}", data)


# -- child sagas -------------------------------------------------------------------------------

invoicing: Saga[Plan] = Saga("invoicing", context="billing", data=Plan)


@invoicing.step(reply=Worked, compensate="void", retry=RETRY, timeout=10)
def issue(data: Plan) -> Command:
    return work("issue", data)


@invoicing.step(reply=Worked, retry=RETRY, timeout=10)
def send(data: Plan) -> Command:
    return work("send", data)


@invoicing.compensation(retry=UNDO_RETRY, timeout=10)
def void(data: Plan) -> Command:
    return revert("issue", data)


parent: Saga[Plan] = Saga("parent", context=CONTEXT, data=Plan)


@parent.step(reply=Worked, compensate="undo_reserve", retry=RETRY, timeout=10)
def reserve(data: Plan) -> Command:
    return work("reserve", data)


bill = parent.child(
    "bill", saga=invoicing, data=lambda plan: msgspec.structs.replace(plan, id=f"{plan.id}-bill")
)


@parent.step(reply=Worked, retry=RETRY, timeout=10)
def ship(data: Plan, ctx: StepContext) -> Command:
    assert ctx.output(bill) == Worked(piece="send")
    return work("ship", data)


@parent.compensation(retry=UNDO_RETRY, timeout=10)
def undo_reserve(data: Plan) -> Command:
    return revert("reserve", data)


# -- TCC ---------------------------------------------------------------------------------------

seats: Saga[Plan] = Saga("seats", context=CONTEXT, data=Plan)


@seats.tcc(
    reply=Worked,
    confirm="confirm_seat",
    cancel="cancel_seat",
    expires=timedelta(minutes=5),
    retry=RETRY,
    timeout=10,
)
def hold_seat(data: Plan) -> Command:
    return work("seat", data)


seats.sleep("nap", lambda plan: timedelta(seconds=plan.nap))


@seats.step(reply=Worked, retry=RETRY, timeout=10)
def pay(data: Plan) -> Command:
    return work("pay", data)


@seats.compensation(retry=UNDO_RETRY, timeout=10)
def confirm_seat(data: Plan, ctx: StepContext) -> Command:
    return command("worker", Confirm(piece=ctx.output(hold_seat).piece, plan=data))


@seats.compensation(retry=UNDO_RETRY, timeout=10)
def cancel_seat(data: Plan) -> Command:
    return revert("seat", data)


DEFINITIONS = [fan, race, invoicing, parent, seats]


@dataclass
class Services:
    """The ``worker`` participant, built fresh per backend; it logs every effect it applies."""

    cancel: Callable[[str], Awaitable[None]]
    effects: list[tuple[str, str, str]] = field(default_factory=list)
    attempts: Counter[str] = field(default_factory=Counter)

    def build(self) -> Participant:
        worker = Participant("worker", serves=[CONTEXT, "billing"])

        @worker.handles(Work)
        async def do(message: Work, ctx: CommandContext) -> Worked | None:
            plan, piece = message.plan, message.piece
            self.attempts[ctx.idempotency_key] += 1
            if piece in plan.cancel_on:
                await self.cancel(ctx.saga_id)
            if self.attempts[ctx.idempotency_key] <= plan.flaky.get(piece, 0):
                raise TransientError(f"{piece} is flaky")
            if piece in plan.fail:
                raise PermanentError(f"{piece} refused")
            self.effects.append((ctx.saga_id, ctx.step, "do"))
            return Worked(piece=piece)

        @worker.handles(Revert)
        async def undo(message: Revert, ctx: CommandContext) -> Worked:
            if message.piece in message.plan.undo_fail:
                raise PermanentError(f"{message.piece} cannot be undone")
            self.effects.append((ctx.saga_id, ctx.step, "undo"))
            return Worked(piece=message.piece)

        @worker.handles(Confirm)
        async def confirm(message: Confirm, ctx: CommandContext) -> Worked:
            if message.piece in message.plan.confirm_fail:
                raise PermanentError(f"{message.piece} cannot be confirmed")
            self.effects.append((ctx.saga_id, ctx.step, "confirm"))
            return Worked(piece=message.piece)

        return worker


def billing_saga(name: str, **options: Any) -> Saga[Plan]:
    """A one-step definition of the billing context (where ``parent`` runs its child), for
    the tests of who may start what there; ``options`` go to :class:`Saga` (``parents=``)."""
    saga: Saga[Plan] = Saga(name, context="billing", data=Plan, **options)

    @saga.step(reply=Worked)
    def issue(data: Plan) -> Command:
        return work("issue", data)

    return saga
