"""A saga that sleeps (until a given time) and then records one effect: for timer fault tests.

The participant stores each effect with its idempotency key atomically (invariant G2), so
the test can tell exactly which effects happened and how often a handler ran.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

import bus
from saga import Command, CommandContext, Context, Participant, Saga, command

NAPS = Context("naps", partitions=4)


class Nap(msgspec.Struct, frozen=True):
    id: str
    until: str = ""  # ISO datetime; empty: sleep one hour
    seconds: int = 3600


class Record(msgspec.Struct, tag=True, frozen=True):
    id: str


class Recorded(msgspec.Struct, tag=True, frozen=True):
    id: str


def _until(data: Nap) -> timedelta | datetime:
    return datetime.fromisoformat(data.until) if data.until else timedelta(seconds=data.seconds)


nap: Saga[Nap] = Saga("nap", context=NAPS, data=Nap)
nap.sleep("sleep", _until)


@nap.step(reply=Recorded)
def record(data: Nap) -> Command:
    return command("recorder", Record(id=data.id))


RECORD = """
redis.call('INCR', KEYS[1])
if redis.call('SET', KEYS[2], 1, 'NX') then redis.call('RPUSH', KEYS[3], ARGV[1]) end
"""


def recorder(redis: bus.Redis) -> Participant:
    """The participant: applies each effect once, counting every run of the handler."""
    participant = Participant("recorder", serves=[NAPS])

    @participant.handles(Record)
    async def on_record(message: Record, ctx: CommandContext) -> Recorded:
        key = ctx.idempotency_key
        await redis.eval(RECORD, 3, f"test:runs:{key}", f"test:applied:{key}", "test:effects", key)  # type: ignore[misc]
        return Recorded(id=message.id)

    return participant
