"""A rate-limited saga app for the real-rate test, run as a worker: ``python -m tests.flow.rate_app``.

One step sends ``Call`` to the participant ``api``, limited to ``RATE_ENV`` commands a second
(burst ``BURST``). The participant records each effect once, with the time it ran it (its own
clock, in ns), in :data:`CALLS`: the test measures the rate the participant saw.
"""

from __future__ import annotations

import os
import time

import anyio
import msgspec

import bus
from redsaga.cli._logging import configure
from saga import App, Command, CommandContext, Participant, RateLimit, Saga, SagaWorker, command
from tests.faults.procs import serve_until_killed

URL_ENV = "RATE_REDIS_URL"
RATE_ENV = "RATE_PER_S"
BURST = 5
CALLS = "{test}:calls"
"""One hash tag for the records and their dedupe keys: one script on a cluster too."""
RECORD = "if redis.call('SET', KEYS[1], 1, 'NX') then redis.call('RPUSH', KEYS[2], ARGV[1]) end"


class Job(msgspec.Struct, frozen=True):
    id: str


class Call(msgspec.Struct, tag=True, frozen=True):
    pass


class Called(msgspec.Struct, tag=True, frozen=True):
    pass


rated = Saga("rated", version=1, context="ratectx", data=Job)


@rated.step(reply=Called, timeout=120)
def call(_job: Job) -> Command:
    return command("api", Call())


api = Participant("api", serves=["ratectx"])
_redis: list[bus.Redis] = []


@api.handles(Call)
async def handle_call(_message: Call, ctx: CommandContext) -> Called:
    """The effect: recorded once per idempotency key, with when it ran."""
    keys = (f"{{test}}:applied:{ctx.idempotency_key}", CALLS)
    await _redis[0].eval(RECORD, 2, *keys, time.time_ns())  # type: ignore[misc]
    return Called()


def app(rate: str = "50/s") -> App:
    """The worker's app, its ``api`` limited to ``rate``."""
    return App("rated", sagas=[rated], participants=[api], limits=[RateLimit("api", rate, burst=BURST)])


async def main() -> None:
    """Run a worker until killed; log ``ready`` once it consumes."""
    configure(json_logs=True, level="warning")
    redis = bus.connect(os.environ[URL_ENV])
    _redis.append(redis)
    worker = SagaWorker(redis, app(os.environ.get(RATE_ENV, "50/s")))
    await serve_until_killed(worker, "rate")


if __name__ == "__main__":
    anyio.run(main)
