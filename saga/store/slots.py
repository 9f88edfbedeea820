"""Concurrency keys' lines in Redis: take a slot or wait in line, give a slot back, wake the next.

Each line (one value of one key) lives under its own hash tag
(:class:`~saga.store.keys.SlotKeys`): one single-slot script (``saga/store/lua/slot.lua``)
whatever partition the saga lives in. Taking a slot and the transition that sends (or
holds) the saga's first command are two scripts in two slots, so each is safe to repeat: a
saga asking again keeps its slot or its place. A slot is given back after the transition
that ends its saga commits; the sagas it goes to are woken by moving their timers to now in
their own partitions (:func:`wake_calls`), and a saga whose wake-up was lost finds its slot
at its next look (``Key.poll``). See docs/flow-control.md.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from bus.lowlevel import CommandCall, ScriptCall, redis_errors, run_batch
from saga.definition.concurrency import Claim
from saga.store.keys import Partition, SlotKeys, slot_lines, slot_waiters
from saga.store.scripts import SLOT

Mode = Literal["wait", "skip", "debounced"]
"""How an acquire treats a busy line: wait in it, be refused, or (after a debounce window) wait
only if still the pending start."""

GRANTED, WAITING, BUSY, REPLACED = 1, 0, -1, -2
"""The verdicts of ``slot.lua``."""


@dataclass(frozen=True, slots=True)
class SlotReply:
    """What ``slot.lua`` answered."""

    verdict: int
    """:data:`GRANTED`, :data:`WAITING`, :data:`BUSY` or :data:`REPLACED`."""
    place: int
    """The saga's place in line (1: next), 0 when it is not in line."""
    waiting: int
    """How many sagas are in line."""
    holders: list[tuple[str, int]]
    """The sagas holding a slot (ref, when they took it in ms)."""
    woken: list[tuple[str, list[str]]]
    """The sagas this call gave a slot to, with the timers that wake them."""
    now_ms: int
    """The script's clock."""


def ref_of(partition: int, saga_id: str) -> str:
    """How a line names a saga: ``<partition>:<saga id>``."""
    return f"{partition}:{saga_id}"


def parse_ref(ref: str) -> tuple[int, str]:
    """``(partition, saga id)`` of a line's ref."""
    partition, _, saga_id = ref.partition(":")
    return int(partition), saga_id


def acquire_call(
    keys: SlotKeys, ref: str, limit: int, claim: Claim, timers: Sequence[str], *, now_ms: int, mode: Mode
) -> ScriptCall:
    """The call taking a slot for ``ref`` or putting it in line (woken by ``timers``)."""
    tenant = claim.tenant or "-"
    args = ("acquire", ref, limit, now_ms, claim.priority, tenant, claim.weight, " ".join(timers), mode)
    return SLOT.call(keys.all(), args)


def release_call(keys: SlotKeys, ref: str, limit: int, *, now_ms: int) -> ScriptCall:
    """The call giving back ``ref``'s slot (or place in line); the next in line take it."""
    return SLOT.call(keys.all(), ("release", ref, limit, now_ms))


def debounce_call(keys: SlotKeys, ref: str, *, now_ms: int) -> ScriptCall:
    """The call making ``ref`` the start whose debounce window is open (replacing any other)."""
    return SLOT.call(keys.all(), ("debounce", ref, 1, now_ms))


def look_call(keys: SlotKeys, ref: str, limit: int, *, now_ms: int) -> ScriptCall:
    """The call reading ``ref``'s place (nothing changes)."""
    return SLOT.call(keys.all(), ("look", ref, limit, now_ms))


def used_call(context: str, keys: SlotKeys, now_ms: int) -> CommandCall:
    """The call recording that the line was used (the index of lines: :func:`slot_lines`)."""
    return CommandCall(("ZADD", slot_lines(context), max(now_ms, 0), f"{keys.name}:{keys.value}"))


def waiter_call(context: str, keys: SlotKeys, ref: str, *, waiting: bool) -> CommandCall:
    """The call recording (or, ``waiting=False``, forgetting) which line ``ref`` waits in."""
    if waiting:
        return CommandCall(("HSET", slot_waiters(context), ref, f"{keys.name}:{keys.value}"))
    return CommandCall(("HDEL", slot_waiters(context), ref))


@dataclass(frozen=True, slots=True)
class Place:
    """Where a waiting saga stands in its line (``saga inspect``)."""

    name: str
    """The key's name."""
    value: str
    """The key's value (as in keys)."""
    place: int
    """1: next. Counts the sagas ahead at a higher priority and of its own tenant; other
    tenants at its priority share the slots with it by weight."""
    waiting: int
    """How many sagas are in line."""


async def place_in_line(redis: Any, context: str, partition: int, saga_id: str) -> Place | None:
    """Where saga ``saga_id`` waits, read with plain reads (``None``: it is in no line)."""
    ref = ref_of(partition, saga_id)
    with redis_errors():
        line = await redis.hget(slot_waiters(context), ref)
        if line is None:
            return None
        name, _, value = _text(line).partition(":")
        keys = SlotKeys(context, name, value)
        entry = await redis.hget(keys.waiting, ref)
        if entry is None:
            return None
        priority, tenant, arrival = _text(entry).split()[:3]
        ahead = int(await redis.zcount(keys.line(priority, tenant), "-inf", f"({arrival}"))
        for higher in await redis.zrangebyscore(keys.priorities, f"({priority}", "+inf"):
            for other in await redis.zrange(keys.tenants(_text(higher)), 0, -1):
                ahead += int(await redis.zcard(keys.line(_text(higher), _text(other))))
        return Place(name, value, ahead + 1, int(await redis.hlen(keys.waiting)))


class LineView(msgspec.Struct, frozen=True, kw_only=True):
    """One concurrency key's line as ``saga limits lines`` shows it."""

    key: str
    """The key's name."""
    value: str
    """The value (as in keys: a long or unsafe value is a digest, ``h.<hex>``)."""
    holders: list[str]
    """The ids of the sagas holding a slot."""
    waiting: int
    """How many sagas wait in line."""
    used_ms: int
    """When the line was last asked (Unix ms)."""


async def read_lines(
    redis: Any, context: str, *, keys: Collection[str] | None = None, most: int = 100
) -> list[LineView]:
    """The ``most`` recently used lines of ``context`` (of the named ``keys``, if given).

    Plain reads in two round trips (the index, then every line's holders and size), so the
    read-only operator and the metrics scrape read them alike.
    """
    with redis_errors():
        indexed = await redis.zrevrangebyscore(
            slot_lines(context), "+inf", "-inf", start=0, num=most, withscores=True
        )
    found: list[tuple[SlotKeys, int]] = []
    for line, used in indexed:
        name, _, value = _text(line).partition(":")
        if keys is None or name in keys:
            found.append((SlotKeys(context, name, value), int(used)))
    calls = [CommandCall(("ZRANGE", k.holders, 0, -1)) for k, _ in found]
    calls += [CommandCall(("HLEN", k.waiting)) for k, _ in found]
    replies: list[Any] = await run_batch(redis, calls) if calls else []
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
    holders, sizes = replies[: len(found)], replies[len(found) :]
    return [
        LineView(
            key=k.name,
            value=k.value,
            holders=[parse_ref(_text(ref))[1] for ref in held],
            waiting=int(size),
            used_ms=used,
        )
        for (k, used), held, size in zip(found, holders, sizes, strict=True)
    ]


def parse_reply(raw: Any) -> SlotReply:
    """A :class:`SlotReply` from ``slot.lua``'s raw reply."""
    verdict, place, waiting, held, woken, now = raw
    holders = [(_text(held[i]), int(held[i + 1])) for i in range(0, len(held), 2)]
    wakes = [(_text(woken[i]), _text(woken[i + 1]).split()) for i in range(0, len(woken), 2)]
    return SlotReply(int(verdict), int(place), int(waiting), holders, wakes, int(now))


def wake_calls(context: str, woken: Iterable[tuple[str, list[str]]], now_ms: int) -> list[CommandCall]:
    """Calls moving the timers of sagas given a slot to ``now_ms`` (only timers still pending)."""
    calls: list[CommandCall] = []
    for ref, timers in woken:
        key = Partition(context, parse_ref(ref)[0]).timers
        calls.extend(CommandCall(("ZADD", key, "XX", now_ms, timer)) for timer in timers)
    return calls


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
