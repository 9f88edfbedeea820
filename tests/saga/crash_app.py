"""A saga app for crash tests, run as a worker process: ``python -m tests.saga.crash_app``.

Its participant applies each effect the way FAULTS.md G2 asks of a real participant: the
effect and its idempotency key are stored together atomically (one script here, one database
transaction in a service), so the test can list exactly which keys took effect
(``test:effects``) and how often a handler ran for each (``test:runs:<key>``: redeliveries
may run a handler again; that is allowed, a second effect is not).
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
    SagaStatus,
    SagaWorker,
    StepContext,
    command,
)

STEPS = ("one", "two", "three")
URL_ENV = "CRASH_REDIS_URL"


class Job(msgspec.Struct, frozen=True):
    id: str
    fail_at: str = ""  # the step that fails permanently ("" for none)


class Do(msgspec.Struct, tag=True, frozen=True):
    step: str
    fail: bool = False


class Undo(msgspec.Struct, tag=True, frozen=True):
    step: str


class Done(msgspec.Struct, tag=True, frozen=True):
    step: str


def expected_effects(job: Job, status: SagaStatus) -> list[str]:
    """The idempotency keys that must have taken effect, in order, for a saga's end state."""
    if status == SagaStatus.COMPLETED:
        return [f"{job.id}:{s}:do" for s in STEPS]
    done = list(STEPS[: STEPS.index(job.fail_at)])
    return [f"{job.id}:{s}:do" for s in done] + [f"{job.id}:{s}:undo" for s in reversed(done)]


RETRY = Retry(attempts=50, initial=0.05, max_delay=0.5)
crash = Saga("crash", version=1, context="crashctx", data=Job)


def _declare(step: str) -> None:
    def do(job: Job) -> Command:
        return command("worker", Do(step=step, fail=job.fail_at == step))

    def undo(_job: Job, _ctx: StepContext) -> Command:
        return command("worker", Undo(step=step))

    do.__name__, undo.__name__ = step, f"undo_{step}"
    crash.step(reply=Done, compensate=f"undo_{step}", retry=RETRY, timeout=5)(do)
    crash.compensation(retry=RETRY)(undo)


for _step in STEPS:
    _declare(_step)

participant = Participant("worker", serves=["crashctx"])
_redis: list[bus.Redis] = []

RECORD = """
redis.call('INCR', KEYS[1])
if redis.call('SET', KEYS[2], 1, 'NX') then redis.call('RPUSH', KEYS[3], ARGV[1]) end
"""


async def record(key: str) -> None:
    """Apply the effect of ``key`` once: the effect and its key are stored atomically."""
    await _redis[0].eval(RECORD, 3, f"test:runs:{key}", f"test:applied:{key}", "test:effects", key)  # type: ignore[misc]


@participant.handles(Do)
async def handle_do(message: Do, ctx: CommandContext) -> Done:
    if message.fail:
        raise bus.PermanentError(f"{message.step} refused {ctx.saga_id}")
    await record(ctx.idempotency_key)
    return Done(step=message.step)


@participant.handles(Undo)
async def handle_undo(message: Undo, ctx: CommandContext) -> Done:
    await record(ctx.idempotency_key)
    return Done(step=message.step)


app = App("crash-worker", sagas=[crash], participants=[participant])
CONFIG = EngineConfig(
    bus=bus.BusConfig(lease_ms=1_500, reclaim_interval_ms=300, block_ms=200, retry_base_ms=50),
)


async def main() -> None:
    """Run a worker until killed."""
    redis = bus.connect(os.environ[URL_ENV])
    _redis.append(redis)
    await SagaWorker(redis, app, config=CONFIG).run()


if __name__ == "__main__":
    anyio.run(main)
