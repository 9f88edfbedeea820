"""A fan-out saga app for crash tests, run as a worker process: ``python -m tests.saga.fan_crash_app``.

Each effect is stored atomically with its idempotency key in ``test:effects`` (invariant
G2), with a map step in the middle: ``one`` -> ``each`` (a map over the job's items, four at
a time) -> ``last``; an item or ``last`` may fail for good. (The saga fault app with the
G1-G8 checker is ``tests/faults/app.py``; this one keeps the map step's crash test small.)
"""

from __future__ import annotations

import os

import anyio
import msgspec

import bus
from saga import (
    App,
    Command,
    CommandContext,
    EngineConfig,
    Participant,
    Retry,
    Saga,
    SagaWorker,
    StepContext,
    command,
)

URL_ENV = "CRASH_REDIS_URL"
RETRY = Retry(attempts=50, initial=0.05, max_delay=0.5)
CONFIG = EngineConfig(
    bus=bus.BusConfig(lease_ms=1_500, reclaim_interval_ms=300, block_ms=200, retry_base_ms=50),
)
RECORD = """
redis.call('INCR', KEYS[1])
if redis.call('SET', KEYS[2], 1, 'NX') then redis.call('RPUSH', KEYS[3], ARGV[1]) end
"""


class FanJob(msgspec.Struct, frozen=True):
    id: str
    items: int = 12
    fail_item: int = -1
    fail_last: bool = False


class Work(msgspec.Struct, tag=True, frozen=True):
    fail: bool = False


class Revert(msgspec.Struct, tag=True, frozen=True):
    pass


class Worked(msgspec.Struct, tag=True, frozen=True):
    pass


fan_crash = Saga("fancrash", version=1, context="fancrashctx", data=FanJob)


@fan_crash.step(reply=Worked, compensate="undo_one", retry=RETRY, timeout=5)
def one(_job: FanJob) -> Command:
    return command("fanworker", Work())


@fan_crash.map(
    items=lambda job: list(range(job.items)),
    reply=Worked,
    compensate="undo_each",
    concurrency=4,
    retry=RETRY,
    timeout=5,
)
def each(job: FanJob, item: int) -> Command:
    return command("fanworker", Work(fail=item == job.fail_item))


@fan_crash.step(reply=Worked, compensate="undo_last", retry=RETRY, timeout=5)
def last(job: FanJob) -> Command:
    return command("fanworker", Work(fail=job.fail_last))


for _name in ("undo_one", "undo_each", "undo_last"):

    def _undo(_job: FanJob, _ctx: StepContext) -> Command:
        return command("fanworker", Revert())

    fan_crash.compensation(_name, retry=RETRY)(_undo)

participant = Participant("fanworker", serves=["fancrashctx"])
_redis: list[bus.Redis] = []


async def record(key: str) -> None:
    """Apply the effect of ``key`` once: the effect and its key are stored atomically."""
    await _redis[0].eval(RECORD, 3, f"test:runs:{key}", f"test:applied:{key}", "test:effects", key)  # type: ignore[misc]


@participant.handles(Work)
async def handle_work(message: Work, ctx: CommandContext) -> Worked:
    if message.fail:
        raise bus.PermanentError(f"{ctx.step} refused")
    await record(ctx.idempotency_key)
    return Worked()


@participant.handles(Revert)
async def handle_revert(_message: Revert, ctx: CommandContext) -> Worked:
    await record(ctx.idempotency_key)
    return Worked()


app = App("fan-crash-worker", sagas=[fan_crash], participants=[participant])


async def main() -> None:
    """Run a worker until killed."""
    redis = bus.connect(os.environ[URL_ENV])
    _redis.append(redis)
    await SagaWorker(redis, app, config=CONFIG).run()


if __name__ == "__main__":
    anyio.run(main)
