"""A small saga for the engine's own tests: book a flight, book a hotel, charge, confirm.

Deterministic retry policies (no jitter) so back-off times can be asserted exactly, a
timeout on every command step (so lost commands end), compensations on the first three
steps, and a local action at the end that reads earlier outputs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from saga import Command, Retry, Saga, StepContext, command
from saga.testing import FakeParticipant, succeed


class Trip(msgspec.Struct, frozen=True, kw_only=True):
    traveller: str
    nights: int = 2
    amount: int = 500


class BookFlight(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    traveller: str


class FlightBooked(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    booking: str


class CancelFlight(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    booking: str


class BookHotel(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    traveller: str
    nights: int


class HotelBooked(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    booking: str


class CancelHotel(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    booking: str


class Charge(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    traveller: str
    amount: int


class Charged(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    charge: str


class Refund(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    charge: str


class Confirmation(msgspec.Struct, frozen=True, kw_only=True):
    summary: str


STEP_RETRY = Retry(attempts=3, initial=1.0, backoff=2.0, max_delay=60.0, jitter=0.0)
UNDO_RETRY = Retry(attempts=3, initial=1.0, backoff=2.0, max_delay=60.0, jitter=0.0)
TIMEOUT = 30.0


Confirm = Callable[[Trip], Awaitable[Confirmation]]


def define(
    name: str = "trip",
    *,
    on_exhausted: Any = "dead_letter",
    confirm: Confirm | None = None,
    hotel_retry: Retry | None = None,
) -> Saga[Trip]:
    """A fresh trip saga; ``confirm`` replaces the local action's body, ``hotel_retry`` a policy."""
    step_retry = Retry(
        attempts=STEP_RETRY.attempts,
        initial=STEP_RETRY.initial,
        backoff=STEP_RETRY.backoff,
        max_delay=STEP_RETRY.max_delay,
        jitter=0.0,
        non_retryable=("GatewayDown",),
        on_exhausted=on_exhausted,
    )
    trip: Saga[Trip] = Saga(name, version=1, context="travel", data=Trip)

    @trip.step(reply=FlightBooked, compensate="cancel_flight", retry=step_retry, timeout=TIMEOUT)
    def book_flight(data: Trip) -> Command:
        return command("airline", BookFlight(traveller=data.traveller))

    @trip.step(reply=HotelBooked, compensate="cancel_hotel", retry=hotel_retry or step_retry, timeout=TIMEOUT)
    def book_hotel(data: Trip) -> Command:
        return command("hotel", BookHotel(traveller=data.traveller, nights=data.nights))

    @trip.step(reply=Charged, compensate="refund", retry=step_retry, timeout=TIMEOUT)
    def charge(data: Trip) -> Command:
        return command("bank", Charge(traveller=data.traveller, amount=data.amount))

    @trip.action(retry=step_retry)
    async def confirm_trip(data: Trip, ctx: StepContext) -> Confirmation:
        if confirm is not None:
            return await confirm(data)
        flight = ctx.output(book_flight).booking
        hotel = ctx.output(book_hotel).booking
        return Confirmation(summary=f"{data.traveller}: {flight} + {hotel}")

    @trip.compensation(retry=UNDO_RETRY, timeout=TIMEOUT)
    def cancel_flight(_data: Trip, ctx: StepContext) -> Command:
        return command("airline", CancelFlight(booking=ctx.output(book_flight).booking))

    @trip.compensation(retry=UNDO_RETRY, timeout=TIMEOUT)
    def cancel_hotel(_data: Trip, ctx: StepContext) -> Command:
        return command("hotel", CancelHotel(booking=ctx.output(book_hotel).booking))

    @trip.compensation(retry=UNDO_RETRY, timeout=TIMEOUT)
    def refund(_data: Trip, ctx: StepContext) -> Command:
        return command("bank", Refund(charge=ctx.output(charge).charge))

    return trip


def airline(**overrides: Any) -> FakeParticipant:
    """The airline, succeeding unless ``overrides`` (command type name -> behaviour) say otherwise."""
    return _fake(
        "airline",
        {
            BookFlight: succeed(lambda c, ctx: FlightBooked(booking=f"F-{ctx.saga_id}")),
            CancelFlight: succeed(),
        },
        overrides,
    )


def hotel(**overrides: Any) -> FakeParticipant:
    """The hotel, succeeding unless ``overrides`` say otherwise."""
    return _fake(
        "hotel",
        {
            BookHotel: succeed(lambda c, ctx: HotelBooked(booking=f"H-{ctx.saga_id}")),
            CancelHotel: succeed(),
        },
        overrides,
    )


def bank(**overrides: Any) -> FakeParticipant:
    """The bank, succeeding unless ``overrides`` say otherwise."""
    return _fake(
        "bank",
        {
            Charge: succeed(lambda c, ctx: Charged(charge=f"C-{ctx.saga_id}")),
            Refund: succeed(),
        },
        overrides,
    )


def _fake(name: str, defaults: dict[type[Any], Any], overrides: dict[str, Any]) -> FakeParticipant:
    fake = FakeParticipant(name, defaults)
    by_name = {t.__name__: t for t in defaults}
    for type_name, behaviour in overrides.items():
        fake.on(by_name[type_name], behaviour)
    return fake


STEPS = ("book_flight", "book_hotel", "charge", "confirm_trip")
