"""Batch handlers (``Bus.handler(..., batch=True)``): one call per read, one outcome per entry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

import bus
from bus import Bus, BusConfig, DefinitionError, Delivery, Publisher, Stream, Worker
from bus._scripts import CommandCall
from tests.helpers import dead_letters, pending

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]

JOBS = Stream("jobs:0", "cmd:jobs")
CONFIG = BusConfig(lease_ms=10_000, retry_base_ms=100, retry_max_ms=1_000, max_deliveries=3)


class Job(msgspec.Struct, tag=True):
    name: str


def jobs_app(calls: list[list[str]], outcome_of: dict[str, BaseException]) -> Bus:
    """A batch handler that records each call's jobs and fails those ``outcome_of`` names."""
    app = Bus("jobs")

    @app.handler(JOBS, Job, batch=True)
    async def run(batch: list[tuple[Job, Delivery]]) -> Sequence[BaseException | None]:
        calls.append([job.name for job, _ in batch])
        return [outcome_of.get(job.name) for job, _ in batch]

    return app


async def publish(redis: bus.Redis, *names: str) -> dict[str, str]:
    """Publish one job per name; return name -> entry id."""
    publisher = Publisher(redis, source="test")
    return {name: str(await publisher.publish(JOBS, Job(name=name), correlation_id=name)) for name in names}


async def entry_ids(redis: bus.Redis) -> dict[str, str]:
    return {
        msgspec.json.decode(fields[b"data"], type=Job).name: entry_id.decode()
        for entry_id, fields in await redis.xrange(JOBS.key)
    }


async def test_every_entry_of_a_read_goes_to_one_call(redis: bus.Redis) -> None:
    calls: list[list[str]] = []
    worker = Worker(redis, jobs_app(calls, {}), config=CONFIG)
    await worker.setup()
    await publish(redis, "a", "b", "c", "d", "e")
    await worker.run_until_idle()
    assert calls == [["a", "b", "c", "d", "e"]]
    assert await pending(redis, JOBS, "jobs") == []
    assert await dead_letters(redis, JOBS) == []


async def test_each_entry_ends_by_its_own_outcome(redis: bus.Redis) -> None:
    outcome_of: dict[str, BaseException] = {
        "declined": bus.PermanentError("card declined"),
        "flaky": RuntimeError("gateway timeout"),
        "taken": bus.LeaseLost("taken over"),
    }
    worker = Worker(redis, jobs_app([], outcome_of), config=CONFIG)
    await worker.setup()
    await publish(redis, "ok", "declined", "flaky", "taken")
    await worker.run_until_idle()

    ids = await entry_ids(redis)
    [letter] = await dead_letters(redis, JOBS)
    assert letter["entry"] == ids["declined"]
    assert letter["reason"] == "permanent failure: PermanentError: card declined"
    # the transient failure waits for its redelivery, the abandoned entry for another consumer
    assert sorted(str(e["id"]) for e in await pending(redis, JOBS, "jobs")) == sorted(
        [ids["flaky"], ids["taken"]]
    )
    failures = await redis.hgetall(JOBS.failures_key("jobs"))
    assert list(failures) == [ids["flaky"].encode()]
    assert b"gateway timeout" in failures[ids["flaky"].encode()]


def raising(batch: list[tuple[Job, Delivery]]) -> list[None]:
    raise RuntimeError(f"bug with {len(batch)} jobs")


def too_few(batch: list[tuple[Job, Delivery]]) -> list[None]:
    return [None] * (len(batch) - 1)


@pytest.mark.parametrize("broken", [raising, too_few])
async def test_a_broken_batch_handler_fails_every_entry_for_a_retry(redis: bus.Redis, broken: Any) -> None:
    app = Bus("jobs")

    @app.handler(JOBS, Job, batch=True)
    async def run(batch: list[tuple[Job, Delivery]]) -> Sequence[BaseException | None]:
        return list(broken(batch))

    worker = Worker(redis, app, config=CONFIG)
    await worker.setup()
    await publish(redis, "a", "b")
    await worker.run_until_idle()
    assert len(await pending(redis, JOBS, "jobs")) == 2
    assert await redis.hlen(JOBS.failures_key("jobs")) == 2
    assert await dead_letters(redis, JOBS) == []


def test_a_batch_handler_takes_one_argument() -> None:
    app = Bus("jobs")
    with pytest.raises(DefinitionError, match="a batch handler takes \\(batch\\), not 2 arguments"):

        @app.handler(JOBS, Job, batch=True)
        async def run(batch: list[tuple[Job, Delivery]], extra: int) -> None:
            del batch, extra


async def test_a_delivery_made_outside_a_worker_refuses_its_calls() -> None:
    delivery = Delivery(
        envelope=bus.Envelope(id="m", type="Job", payload=b"{}"),
        stream=JOBS,
        group="jobs",
        entry_id="1-0",
        deliveries=1,
        consumer="c",
    )
    call = CommandCall(("GET", "k"))
    with pytest.raises(bus.BusError, match="not attached to a worker"):
        await delivery.call(call)
    with pytest.raises(bus.BusError, match="not attached to a worker"):
        await delivery.call_many([call])
    with pytest.raises(bus.BusError, match="cannot publish"):
        await delivery.publish(JOBS, Job(name="a"))
