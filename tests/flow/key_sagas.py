"""Sagas with concurrency keys for the flow tests: a withdrawal per account, a ledger that records.

``withdraw`` debits then notifies (a refund undoes the debit); at most one saga per account
runs at once. The ledger participant records every command it carries out (saga id, step) in
:data:`LOG`, in the order it handled them, so a test reads from the participant's own record
what ran when; it refuses the commands named in :data:`FAILS` instead. :data:`ENDS` are the
ways a saga holding a slot can end, made by those refusals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from saga import (
    App,
    Command,
    CommandContext,
    Key,
    Participant,
    PermanentError,
    Retry,
    Saga,
    SagaStatus,
    TransientError,
    command,
)


class Withdrawal(msgspec.Struct, frozen=True):
    account: str
    amount: int = 1
    priority: int = 0
    tenant: str = ""


class Debit(msgspec.Struct, tag=True, frozen=True):
    account: str


class Debited(msgspec.Struct, tag=True, frozen=True):
    pass


class Notify(msgspec.Struct, tag=True, frozen=True):
    account: str


class Notified(msgspec.Struct, tag=True, frozen=True):
    pass


class Refund(msgspec.Struct, tag=True, frozen=True):
    account: str


class Refunded(msgspec.Struct, tag=True, frozen=True):
    pass


LOG: list[tuple[str, str]] = []
"""(saga id, what) for each command the ledger carried out, in order."""
FAILS: dict[tuple[str, str], type[Exception]] = {}
"""(saga id, what) the ledger refuses every time, with the error it raises."""
RETRY = Retry(attempts=2, initial=60.0, jitter=0.0)
"""One retry, a minute on: a saga whose command failed transiently moves on only with its clock."""


def forget() -> None:
    """Clear the ledger's record and refusals (between tests)."""
    LOG.clear()
    FAILS.clear()


@dataclass(frozen=True)
class End:
    """A way the holder of a slot ends: the ledger's refusals, then what the test does."""

    status: SagaStatus
    fails: dict[str, type[Exception]] = field(default_factory=dict)
    then: str = ""
    """``cancel`` (the holder is cancelled), ``retry`` (its clock moves past its retry) or nothing."""


ENDS = {
    "cancelled": End(SagaStatus.CANCELLED, {"notify": TransientError}, then="cancel"),
    "failed": End(SagaStatus.FAILED, {"debit": PermanentError}),
    "compensated": End(SagaStatus.COMPENSATED, {"notify": PermanentError}),
    "dead_lettered": End(SagaStatus.DEAD_LETTERED, {"debit": TransientError}, then="retry"),
}


def withdrawal_saga(key: Key, name: str = "withdraw") -> Saga[Withdrawal]:
    """A two-step saga over ``key`` (its steps send to ``ledger``)."""
    saga = Saga(name, version=1, context="bank", data=Withdrawal, concurrency=key)

    @saga.step(reply=Debited, compensate="refund", retry=RETRY)
    def debit(data: Withdrawal) -> Command:
        return command("ledger", Debit(account=data.account))

    @saga.step(reply=Notified, retry=RETRY)
    def notify(data: Withdrawal) -> Command:
        return command("ledger", Notify(account=data.account))

    @saga.compensation()
    def refund(data: Withdrawal) -> Command:
        return command("ledger", Refund(account=data.account))

    return saga


ledger = Participant("ledger", serves=["bank"])


def _carry_out(ctx: CommandContext, what: str) -> None:
    error = FAILS.get((ctx.saga_id, what))
    if error is not None:
        raise error(f"the ledger refuses {what} of {ctx.saga_id}")
    LOG.append((ctx.saga_id, what))


@ledger.handles(Debit)
async def handle_debit(_message: Debit, ctx: CommandContext) -> Debited:
    _carry_out(ctx, "debit")
    return Debited()


@ledger.handles(Notify)
async def handle_notify(_message: Notify, ctx: CommandContext) -> Notified:
    _carry_out(ctx, "notify")
    return Notified()


@ledger.handles(Refund)
async def handle_refund(_message: Refund, ctx: CommandContext) -> Refunded:
    _carry_out(ctx, "refund")
    return Refunded()


def bank(saga: Saga[Withdrawal], *, with_ledger: bool = True) -> App:
    """An app running ``saga`` (and the ledger, unless ``with_ledger`` is false)."""
    return App("bank", sagas=[saga], participants=[ledger] if with_ledger else [])
