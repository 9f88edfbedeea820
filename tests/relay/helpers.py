"""Helpers shared by the relay tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

import bus
from tests.helpers import eventually


class Charged(msgspec.Struct, tag=True):
    order: str
    seq: int = 0
    note: str = ""


class Charge(msgspec.Struct, tag=True):
    order: str
    amount: int


PAYMENTS = bus.Stream.named("payments")


async def entries(redis: bus.Redis, stream: bus.Stream = PAYMENTS) -> list[tuple[str, bus.Envelope]]:
    """Every entry of ``stream`` as (entry id, envelope)."""
    raw = await redis.xrange(stream.key)
    return [
        (entry_id.decode(), bus.decode_fields(fields, max_bytes=1 << 22, max_fields=32))
        for entry_id, fields in raw
    ]


async def orders(redis: bus.Redis, stream: bus.Stream = PAYMENTS) -> list[str]:
    """The ``order`` of every Charged on ``stream``, in stream order."""
    return [envelope.decode(Charged).order for _, envelope in await entries(redis, stream)]


async def wait_for(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Poll ``check`` until it holds; fail after ``timeout_s`` (for real processes and servers)."""
    await eventually(check, timeout_s, "the relay's condition holds", poll=0.01)
