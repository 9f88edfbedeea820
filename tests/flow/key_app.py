"""A bank with one withdrawal per account at a time, run as a worker: ``python -m tests.flow.key_app``.

``withdraw`` debits then notifies through the participant ``ledger``; its concurrency key is
the account (limit 1). The ledger records each effect once per idempotency key, with the time
it ran it (its own clock, in ns), in ``{test}:effects`` as ``<saga id> <step> <ns>``: the test
checks from these records alone that no two sagas of an account ran side by side.
"""

from __future__ import annotations

import os
import time

import anyio
import msgspec

import bus
from redsaga.cli._logging import configure
from saga import App, Command, CommandContext, EngineConfig, Key, Participant, Saga, SagaWorker, command
from tests.faults.procs import serve_until_killed

URL_ENV = "KEY_REDIS_URL"
EFFECTS = "{test}:effects"
"""One hash tag for the records and their dedupe keys: one script on a cluster too."""
RECORD = "if redis.call('SET', KEYS[1], 1, 'NX') then redis.call('RPUSH', KEYS[2], ARGV[1]) end"


class Withdrawal(msgspec.Struct, frozen=True):
    account: str


class Debit(msgspec.Struct, tag=True, frozen=True):
    pass


class Debited(msgspec.Struct, tag=True, frozen=True):
    pass


class Notify(msgspec.Struct, tag=True, frozen=True):
    pass


class Notified(msgspec.Struct, tag=True, frozen=True):
    pass


withdraw = Saga(
    "withdraw", version=1, context="bank", data=Withdrawal, concurrency=Key(lambda d: d.account, poll=1.0)
)


@withdraw.step(reply=Debited, timeout=60)
def debit(_data: Withdrawal) -> Command:
    return command("ledger", Debit())


@withdraw.step(reply=Notified, timeout=60)
def notify(_data: Withdrawal) -> Command:
    return command("ledger", Notify())


ledger = Participant("ledger", serves=["bank"])
_redis: list[bus.Redis] = []


async def _record(ctx: CommandContext, step: str) -> None:
    keys = (f"{{test}}:applied:{ctx.idempotency_key}", EFFECTS)
    await _redis[0].eval(RECORD, 2, *keys, f"{ctx.saga_id} {step} {time.time_ns()}")  # type: ignore[misc]


@ledger.handles(Debit)
async def handle_debit(_message: Debit, ctx: CommandContext) -> Debited:
    """The first effect: the saga is past its first step once it is recorded."""
    await _record(ctx, "debit")
    return Debited()


@ledger.handles(Notify)
async def handle_notify(_message: Notify, ctx: CommandContext) -> Notified:
    """The last effect: the saga's work ends here."""
    await _record(ctx, "notify")
    return Notified()


app = App("bank", sagas=[withdraw], participants=[ledger])
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=2_000))


async def main() -> None:
    """Run a worker until killed; log ``ready`` once it consumes."""
    configure(json_logs=True, level="warning")
    redis = bus.connect(os.environ[URL_ENV])
    _redis.append(redis)
    worker = SagaWorker(redis, app, config=CONFIG)
    await serve_until_killed(worker, "key")


if __name__ == "__main__":
    anyio.run(main)
