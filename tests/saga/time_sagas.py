"""Sagas that wait: a loan that asks for approval, cools off and waits for funds; a trip with
a deadline. Used by the runner tests and the Redis tests of durable time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from saga import Command, CommandContext, Participant, Saga, StepContext, command
from saga.testing import FakeParticipant, succeed

LENDING = "lending"
TREASURY_EVENTS = "treasury.events"


class Loan(msgspec.Struct, frozen=True):
    id: str
    amount: int
    sleep_until: str = ""  # ISO datetime: sleep until then instead of the cool-off hour


class Reserve(msgspec.Struct, tag=True, frozen=True):
    loan_id: str
    amount: int


class Reserved(msgspec.Struct, tag=True, frozen=True):
    loan_id: str


class Release(msgspec.Struct, tag=True, frozen=True):
    loan_id: str


class Released(msgspec.Struct, tag=True, frozen=True):
    loan_id: str


class AskApproval(msgspec.Struct, tag=True, frozen=True):
    loan_id: str
    token: str


class Asked(msgspec.Struct, tag=True, frozen=True):
    loan_id: str


class Approval(msgspec.Struct, frozen=True):
    approved: bool
    by: str


class FundsReady(msgspec.Struct, tag=True, frozen=True):
    loan_id: str
    ref: str


class Disburse(msgspec.Struct, tag=True, frozen=True):
    loan_id: str
    ref: str


class Disbursed(msgspec.Struct, tag=True, frozen=True):
    loan_id: str


loan: Saga[Loan] = Saga("loan", version=1, context=LENDING, data=Loan)


@loan.step(reply=Reserved, compensate="release")
def reserve(data: Loan) -> Command:
    return command("ledger", Reserve(loan_id=data.id, amount=data.amount))


@loan.step(reply=Asked)
def ask(data: Loan, ctx: StepContext) -> Command:
    return command("mailer", AskApproval(loan_id=data.id, token=ctx.resume_token(approval)))


approval = loan.wait_signal("approval", output=Approval, timeout=timedelta(days=2))


def cool_off_time(data: Loan) -> timedelta | datetime:
    if data.sleep_until:
        return datetime.fromisoformat(data.sleep_until)
    return timedelta(hours=1)


cool_off = loan.sleep("cool_off", cool_off_time)
funds = loan.wait_event(
    "funds",
    stream=TREASURY_EVENTS,
    message=FundsReady,
    key=lambda event: event.loan_id,
    match=lambda data: data.id,
    timeout=timedelta(days=1),
)


@loan.step(reply=Disbursed)
def disburse(data: Loan, ctx: StepContext) -> Command:
    return command("ledger", Disburse(loan_id=data.id, ref=ctx.output(funds).ref))


@loan.compensation()
def release(data: Loan) -> Command:
    return command("ledger", Release(loan_id=data.id))


class Trip(msgspec.Struct, frozen=True):
    id: str
    undo: bool = True


trip: Saga[Trip] = Saga("trip", version=1, context=LENDING, data=Trip, deadline=timedelta(days=7))


@trip.step(reply=Reserved, compensate="unbook")
def book(data: Trip) -> Command:
    return command("ledger", Reserve(loan_id=data.id, amount=1))


trip.sleep("long_wait", timedelta(days=10))


@trip.step(reply=Disbursed)
def pay(data: Trip) -> Command:
    return command("ledger", Disburse(loan_id=data.id, ref="trip"))


@trip.compensation()
def unbook(data: Trip) -> Command:
    return command("ledger", Release(loan_id=data.id))


def fakes() -> list[FakeParticipant]:
    """Participants that always succeed (the mailer records the tokens it was sent)."""
    ledger = FakeParticipant(
        "ledger",
        {
            Reserve: succeed(lambda c: Reserved(loan_id=c.loan_id)),
            Release: succeed(lambda c: Released(loan_id=c.loan_id)),
            Disburse: succeed(lambda c: Disbursed(loan_id=c.loan_id)),
        },
    )
    mailer = FakeParticipant("mailer", {AskApproval: succeed(lambda c: Asked(loan_id=c.loan_id))})
    return [ledger, mailer]


def participants(effects: list[tuple[str, str]], tokens: list[str]) -> list[Participant]:
    """Real participants for a Redis worker, logging effects (saga id, message) and tokens."""
    ledger = Participant("ledger", serves=[LENDING])
    mailer = Participant("mailer", serves=[LENDING])

    @ledger.handles(Reserve)
    async def on_reserve(message: Reserve, _ctx: CommandContext) -> Reserved:
        effects.append((message.loan_id, "reserve"))
        return Reserved(loan_id=message.loan_id)

    @ledger.handles(Release)
    async def on_release(message: Release, _ctx: CommandContext) -> Released:
        effects.append((message.loan_id, "release"))
        return Released(loan_id=message.loan_id)

    @ledger.handles(Disburse)
    async def on_disburse(message: Disburse, _ctx: CommandContext) -> Disbursed:
        effects.append((message.loan_id, "disburse"))
        return Disbursed(loan_id=message.loan_id)

    @mailer.handles(AskApproval)
    async def on_ask(message: AskApproval, _ctx: CommandContext) -> Asked:
        tokens.append(message.token)
        return Asked(loan_id=message.loan_id)

    return [ledger, mailer]


NOON = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
