"""Sagas for the tracing tests: a trip that books, sleeps (a timer) and runs a child saga in
another context; participants whose handlers make spans of their own."""

from __future__ import annotations

from datetime import timedelta

import msgspec

from bus.tracing import tracer
from saga import App, Command, CommandContext, Context, Participant, PermanentError, Saga, command

TRIPS = Context("trips")
VISAS = Context("visas")


class Trip(msgspec.Struct, frozen=True):
    id: str
    pay: str = "ok"  # "declined": the payment fails for good and the booking is undone


class Book(msgspec.Struct, tag=True, frozen=True):
    trip: str


class Booked(msgspec.Struct, tag=True, frozen=True):
    ref: str


class Cancel(msgspec.Struct, tag=True, frozen=True):
    ref: str


class Cancelled(msgspec.Struct, tag=True, frozen=True):
    ref: str


class Pay(msgspec.Struct, tag=True, frozen=True):
    trip: str
    card: str


class Paid(msgspec.Struct, tag=True, frozen=True):
    ref: str


class Visa(msgspec.Struct, frozen=True):
    trip: str


class Stamp(msgspec.Struct, tag=True, frozen=True):
    trip: str


class Stamped(msgspec.Struct, tag=True, frozen=True):
    ref: str


visa: Saga[Visa] = Saga("visa", context=VISAS, data=Visa)


@visa.step(reply=Stamped)
def stamp(data: Visa) -> Command:
    return command("consulate", Stamp(trip=data.trip))


trip: Saga[Trip] = Saga("trip", version=3, context=TRIPS, data=Trip)


@trip.step(reply=Booked, compensate="cancel")
def book(data: Trip) -> Command:
    return command("hotels", Book(trip=data.id))


@trip.compensation()
def cancel(_data: Trip, ctx: object) -> Command:
    return command("hotels", Cancel(ref="r"))


@trip.step(reply=Paid)
def pay(data: Trip) -> Command:
    return command("bank", Pay(trip=data.id, card=data.pay))


trip.sleep("nap", timedelta(hours=1))
trip.child("papers", saga=visa, data=lambda data: Visa(trip=data.id))

approval: Saga[Trip] = Saga("approval", context=TRIPS, data=Trip)
approval.wait_signal("ok")


@approval.step(reply=Booked)
def book_approved(data: Trip) -> Command:
    return command("hotels", Book(trip=data.id))


hotels = Participant("hotels", serves=[TRIPS])
bank = Participant("bank", serves=[TRIPS])
consulate = Participant("consulate", serves=[VISAS])


@hotels.handles(Book)
async def on_book(message: Book, ctx: CommandContext) -> Booked:
    found = tracer()
    if found is not None:  # the handler's own span: it nests in the step's
        with found.start_as_current_span("hotel lookup"):
            pass
    return Booked(ref=f"r-{message.trip}")


@hotels.handles(Cancel)
async def on_cancel(message: Cancel, _ctx: CommandContext) -> Cancelled:
    return Cancelled(ref=message.ref)


@bank.handles(Pay)
async def on_pay(message: Pay, _ctx: CommandContext) -> Paid:
    if message.card == "declined":
        raise PermanentError("card declined")
    return Paid(ref=f"p-{message.trip}")


@consulate.handles(Stamp)
async def on_stamp(message: Stamp, _ctx: CommandContext) -> Stamped:
    return Stamped(ref=f"v-{message.trip}")


orchestrators = App("trips-orchestrators", sagas=[trip, visa, approval])
services = App("trip-services", participants=[hotels, bank, consulate])
