"""Shared round trips: the client-side Batcher and the worker's Completer carry reads too."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import anyio
import pytest

import bus
import bus._batcher as batcher_module
from bus._batcher import Batcher
from bus._clock import SystemClock
from bus._completer import Completer
from bus._scripts import CommandCall, Library

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]


async def test_concurrent_calls_share_a_pipeline_and_each_gets_its_own_result(redis: bus.Redis) -> None:
    await redis.hset("h", mapping={"a": "1"})
    batcher = Batcher(redis)
    results: dict[int, object] = {}

    async def one(n: int) -> None:
        key = "h" if n % 2 else "missing"
        results[n] = await batcher.call(CommandCall(("HGETALL", key)))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            for n in range(10):
                group.start_soon(one, n)
    assert results == {n: ({b"a": b"1"} if n % 2 else {}) for n in range(10)}


async def test_a_failed_call_raises_for_its_caller_only(redis: bus.Redis) -> None:
    await redis.set("s", "text")
    batcher = Batcher(redis)
    outcomes: dict[str, object] = {}

    async def one(key: str) -> None:
        try:
            outcomes[key] = await batcher.call(CommandCall(("HGETALL", key)))
        except bus.BusError as error:
            outcomes[key] = type(error)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(one, "s")  # WRONGTYPE
            group.start_soon(one, "other")
    assert outcomes == {"s": bus.RedisCommandError, "other": {}}


async def test_a_script_whose_library_is_not_loaded_is_loaded_and_run(redis: bus.Redis) -> None:
    # never loaded: the first FCALL says "function not found"
    script = Library.build("test", {"fresh": f"-- {uuid.uuid4()}\nreturn ARGV[1]"}).script("fresh")
    batcher = Batcher(redis)
    assert await batcher.call(script.call([], ["hello"])) == b"hello"


async def test_the_completer_fails_unretried_calls_when_redis_is_unreachable() -> None:
    unreachable = bus.connect(
        "redis://127.0.0.1:1/0", bus.ClientConfig(retries=0, connect_timeout_s=0.5, socket_timeout_s=0.5)
    )
    completer = Completer(unreachable, SystemClock())
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(completer.run)
            with pytest.raises(bus.RedisUnavailable):
                await completer.call(CommandCall(("HGETALL", "k")), retry=False)
            group.cancel_scope.cancel()


async def test_a_burst_is_split_into_bounded_pipelines(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:

    sizes: list[int] = []
    run_batch = batcher_module.run_batch

    async def counting(client: bus.Redis, calls: list[object], **options: Any) -> list[object]:
        sizes.append(len(calls))
        return await run_batch(client, calls, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(batcher_module, "run_batch", counting)
    batcher = Batcher(redis)
    results: list[object] = []

    async def one() -> None:
        results.append(await batcher.call(CommandCall(("HGETALL", "k"))))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for _ in range(batcher_module.MAX_BATCH + 10):
                group.start_soon(one)
    assert results == [{}] * (batcher_module.MAX_BATCH + 10)
    assert max(sizes) <= batcher_module.MAX_BATCH
    assert sum(sizes) == batcher_module.MAX_BATCH + 10


async def test_the_batcher_fails_every_caller_of_a_round_when_redis_is_unreachable() -> None:
    unreachable = bus.connect(
        "redis://127.0.0.1:1/0", bus.ClientConfig(retries=0, connect_timeout_s=0.5, socket_timeout_s=0.5)
    )
    batcher = Batcher(unreachable)
    outcomes: list[object] = []

    async def one() -> None:
        try:
            await batcher.call(CommandCall(("HGETALL", "k")))
        except bus.BusError as error:
            outcomes.append(type(error))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(one)
    assert outcomes == [bus.RedisUnavailable] * 3


async def test_a_bug_in_a_round_reaches_every_caller_and_the_next_round_still_runs(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_batch = batcher_module.run_batch
    rounds: list[int] = []

    async def broken_once(client: bus.Redis, calls: list[object], **options: Any) -> list[object]:
        rounds.append(len(calls))
        if len(rounds) == 1:
            raise RuntimeError("a bug")
        return await run_batch(client, calls, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(batcher_module, "run_batch", broken_once)
    batcher = Batcher(redis)
    outcomes: list[object] = []

    async def one() -> None:
        try:
            outcomes.append(await batcher.call(CommandCall(("HGETALL", "k"))))
        except RuntimeError as error:
            outcomes.append(str(error))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for _ in range(2):
                group.start_soon(one)
        await one()  # a later call gets a sender of its own
    assert outcomes == ["a bug", "a bug", {}]
    assert rounds == [2, 1]


async def test_a_cancelled_sender_cancels_its_callers_and_leaves_no_sender_behind(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = anyio.Event()

    async def hangs(_client: bus.Redis, _calls: list[object], **_options: Any) -> list[object]:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover - never woken

    monkeypatch.setattr(batcher_module, "run_batch", hangs)
    batcher = Batcher(redis)
    cancelled: list[str] = []

    async def one(name: str) -> None:
        try:
            await batcher.call(CommandCall(("HGETALL", name)))
        except asyncio.CancelledError:
            cancelled.append(name)  # swallowed: the test's own scope was not cancelled

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(one, "a")
            group.start_soon(one, "b")
            await started.wait()
            sender = batcher._sender  # the task the event loop would cancel on close
            assert sender is not None
            sender.cancel()
    assert sorted(cancelled) == ["a", "b"]
    assert batcher._sender is None


@pytest.mark.redis
async def test_a_publish_waiting_for_replicas_raises_when_too_few_acknowledged(real_redis: bus.Redis) -> None:
    """The entry stands on the master; the caller learns a failover now could lose it."""
    waiting = bus.Publisher(real_redis, config=bus.BusConfig(replica_acks=1, replica_ack_timeout_ms=10))
    stream = bus.Stream("orders:0", "events")
    envelope = bus.Envelope(id="m1", type="Happened", payload=b"{}")
    with pytest.raises(bus.ReplicaAckTimeout) as late:
        await waiting.publish_envelope(stream, envelope)
    assert (late.value.acked, late.value.wanted) == (0, 1)
    assert await real_redis.xlen(stream.key) == 1
    with pytest.raises(bus.ReplicaAckTimeout):  # a retry is safe: the id is remembered
        await waiting.publish_envelope(stream, envelope)
    assert await real_redis.xlen(stream.key) == 1


async def test_publishing_many_raises_the_first_error(redis: bus.Redis) -> None:
    await redis.set("rs:{orders:0}:events", "not a stream")
    envelopes = [bus.Envelope(id=f"m{n}", type="Happened", payload=b"{}") for n in range(2)]
    items = [
        (bus.Stream("orders:0", "other"), envelopes[0]),
        (bus.Stream("orders:0", "events"), envelopes[1]),
    ]
    with pytest.raises(bus.RedisCommandError, match="WRONGTYPE"):
        await bus.Publisher(redis).publish_many(items)
    assert await redis.xlen("rs:{orders:0}:other") == 1  # calls before the failing one stand
