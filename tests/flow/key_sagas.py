"""Sagas with concurrency keys for the flow tests: a withdrawal per account, a ledger that records.

``withdraw`` debits then notifies; at most one saga per account runs at once. The ledger
participant records every command it handles (saga id, step) in :data:`LOG`, in the order
it handled them, so a test reads from the participant's own record what ran when.
"""

from __future__ import annotations

import msgspec

from saga import App, Command, CommandContext, Key, Participant, Saga, command


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


LOG: list[tuple[str, str]] = []
"""(saga id, what) for each command the ledger handled, in order."""


def withdrawal_saga(key: Key, name: str = "withdraw") -> Saga[Withdrawal]:
    """A two-step saga over ``key`` (its steps send to ``ledger``)."""
    saga = Saga(name, version=1, context="bank", data=Withdrawal, concurrency=key)

    @saga.step(reply=Debited)
    def debit(data: Withdrawal) -> Command:
        return command("ledger", Debit(account=data.account))

    @saga.step(reply=Notified)
    def notify(data: Withdrawal) -> Command:
        return command("ledger", Notify(account=data.account))

    return saga


ledger = Participant("ledger", serves=["bank"])


@ledger.handles(Debit)
async def handle_debit(_message: Debit, ctx: CommandContext) -> Debited:
    LOG.append((ctx.saga_id, "debit"))
    return Debited()


@ledger.handles(Notify)
async def handle_notify(_message: Notify, ctx: CommandContext) -> Notified:
    LOG.append((ctx.saga_id, "notify"))
    return Notified()


def bank(saga: Saga[Withdrawal], *, with_ledger: bool = True) -> App:
    """An app running ``saga`` (and the ledger, unless ``with_ledger`` is false)."""
    return App("bank", sagas=[saga], participants=[ledger] if with_ledger else [])
