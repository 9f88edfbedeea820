"""Definitions for the versioning tests: a small order saga built from a description, so each
test changes exactly one thing about a registered version."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from saga import (
    App,
    Command,
    CommandContext,
    Context,
    Instance,
    Participant,
    Plan,
    Saga,
    StepContext,
    command,
    migration,
)


class Order(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    total: int
    note: str = ""


class Reserve(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    order_id: str


class Reserved(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    reservation: str


class Release(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    reservation: str


class Charge(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    order_id: str
    total: int


class Charged(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    charge: str


class Refund(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    charge: str


class Ship(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    order_id: str


class Shipped(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    tracking: str


class Done(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    ok: bool = True


CONTEXT = Context("shop")
STEPS = ("reserve", "charge", "ship")
REPLIES: dict[str, type[Any]] = {"reserve": Reserved, "charge": Charged, "ship": Shipped}
COMMANDS: dict[str, tuple[str, type[Any]]] = {
    "reserve": ("stock", Reserve),
    "charge": ("bank", Charge),
    "ship": ("post", Ship),
}
UNDO = {"reserve": "release", "charge": "refund"}


def build(
    *,
    version: int = 1,
    steps: Sequence[str] = STEPS,
    data: type[Any] = Order,
    undo: dict[str, str] | None = None,
    actions: Sequence[str] = (),
    local_undo: Sequence[str] = (),
    replies: dict[str, type[Any]] | None = None,
    context: Context = CONTEXT,
    aliases: dict[str, str] | None = None,
) -> Saga[Any]:
    """The order saga with ``steps`` in order; names not in COMMANDS become local actions.

    ``aliases`` gives a step another step's behaviour (``{"pay": "charge"}``: a renamed step).
    """
    undo = UNDO if undo is None else undo
    aliases = aliases or {}
    replies = {**REPLIES, **(replies or {})}
    definition: Saga[Any] = Saga("shop_order", version=version, context=context, data=data)
    for name in steps:
        base = aliases.get(name, name)
        compensate = undo.get(name)
        if name in actions or base not in COMMANDS:
            definition.action(name=name, compensate=compensate)(_action(replies.get(base, Done)))
        else:
            definition.step(reply=replies[base], name=name, compensate=compensate)(_builder(base))
    for step, compensation in undo.items():
        if step in steps:
            undo_function = (
                _local_undo() if step in local_undo else _undo(definition, step, aliases.get(step, step))
            )
            definition.compensation(compensation)(undo_function)
    return definition


def _builder(name: str) -> Any:
    participant, message = COMMANDS[name]

    def build_command(data: Any) -> Command:
        fields = {"order_id": data.id}
        if message is Charge:
            fields["total"] = data.total
        return command(participant, message(**fields))

    return build_command


def _action(output: type[Any]) -> Any:
    async def act(data: Any) -> Any:
        return output()

    act.__annotations__ = {"data": Any, "return": output}
    return act


def _undo(definition: Saga[Any], step: str, base: str) -> Any:
    def undo(data: Any, ctx: StepContext) -> Command:
        output = ctx.output(definition.step_named(step))
        if base == "reserve":
            return command("stock", Release(reservation=output.reservation))
        return command("bank", Refund(charge=output.charge))

    return undo


def _local_undo() -> Any:
    async def undo(data: Any, ctx: StepContext) -> None:
        return None

    return undo


stock = Participant("stock", serves=[CONTEXT])
bank = Participant("bank", serves=[CONTEXT])
post = Participant("post", serves=[CONTEXT])


@stock.handles(Reserve)
async def reserve(cmd: Reserve, ctx: CommandContext) -> Reserved:
    return Reserved(reservation=f"r-{cmd.order_id}")


@stock.handles(Release)
async def release(cmd: Release, ctx: CommandContext) -> None:
    return None


@bank.handles(Charge)
async def charge(cmd: Charge, ctx: CommandContext) -> Charged:
    return Charged(charge=f"c-{cmd.order_id}")


@bank.handles(Refund)
async def refund(cmd: Refund, ctx: CommandContext) -> None:
    return None


@post.handles(Ship)
async def ship(cmd: Ship, ctx: CommandContext) -> Shipped:
    return Shipped(tracking=f"t-{cmd.order_id}")


V1 = build()
"""Registered version 1: reserve -> charge -> ship."""
V2 = build(version=2, steps=("reserve", "charge", "gift_wrap", "ship"))
"""Version 2: a local action inserted before shipping (breaking for v1, hence a new version)."""
V1_BROKEN = build(steps=("reserve", "ship"))
"""Version 1 with the charge step removed: what a careless deploy looks like."""
V1_APPENDED = build(steps=(*STEPS, "notify"))
"""Version 1 with a step appended: safe."""

app_v1 = App("shop", sagas=[V1], participants=[stock, bank, post])
app_v1_v2 = App("shop", sagas=[V1, V2], participants=[stock, bank, post])
app_v2_only = App("shop", sagas=[V2], participants=[stock, bank, post])
app_broken = App("shop", sagas=[V1_BROKEN], participants=[stock, bank, post])
app_appended = App("shop", sagas=[V1_APPENDED], participants=[stock, bank, post])


@migration(V1, V2)
def v1_to_v2(instance: Instance[Order]) -> Plan | None:
    """Sagas past the new gift_wrap step skip it; ids starting 'refuse' make the function raise."""
    if instance.id.startswith("refuse"):
        raise ValueError("this order is special")
    if instance.id.startswith("leave"):
        return None
    return Plan(skip=["gift_wrap"] if instance.current == "ship" else (), reason="gift wrapping")


app_migrating = App("shop", sagas=[V1, V2], participants=[stock, bank, post], migrations=[v1_to_v2])
