"""Group steps on Redis: racing workers, the branch hash, and a 1,000-item map.

- Two orchestrators deciding replies of different branches of one saga: the one that
  decided on a stale revision loses the commit and decides again on fresh state; no branch
  result is lost (deterministically, then with two whole workers racing).
- A map over 1,000 items with concurrency 20 completes, and its saga hash stays bounded:
  the group step's record holds counters and the branches in flight, the branch records
  live in the branch hash (measured here; see docs/composition.md for the numbers).
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

import bus
from bus import FakeClock
from bus.lowlevel import CommandCall, ScriptCall
from saga import (
    App,
    Command,
    CommandContext,
    Participant,
    Saga,
    SagaClient,
    SagaStatus,
    SagaWorker,
    StepContext,
    command,
)
from saga.runtime import orchestrator as orchestrator_module
from saga.store.commit import commit_result
from saga.store.keys import Partition
from saga.testing import decode_history, invariant_violations, replay

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
PARTITION = Partition("bulk", 0)


class Batch(msgspec.Struct, frozen=True):
    items: list[int]


class Handle(msgspec.Struct, tag=True, frozen=True):
    item: int


class Handled(msgspec.Struct, tag=True, frozen=True):
    item: int
    total: int


class Report(msgspec.Struct, tag=True, frozen=True):
    total: int


class Reported(msgspec.Struct, tag=True, frozen=True):
    total: int


def bulk_saga(concurrency: int | None, limit: int = 1_000) -> Saga[Batch]:
    saga: Saga[Batch] = Saga(f"bulk_{concurrency}", context="bulk", data=Batch)

    @saga.map(items=lambda batch: batch.items, reply=Handled, concurrency=concurrency, limit=limit)
    def each(_data: Batch, item: int) -> Command:
        return command("handler", Handle(item=item))

    @saga.step(reply=Reported)
    def total(_data: Batch, ctx: StepContext) -> Command:
        return command("handler", Report(total=sum(h.total for h in ctx.output(each))))

    return saga


def handler_app(effects: list[tuple[str, str]]) -> App:
    handler = Participant("handler", serves=["bulk"])

    @handler.handles(Handle)
    async def handle(message: Handle, ctx: CommandContext) -> Handled:
        effects.append((ctx.saga_id, ctx.step))
        return Handled(item=message.item, total=message.item * 2)

    @handler.handles(Report)
    async def report(message: Report, _ctx: CommandContext) -> Reported:
        return Reported(total=message.total)

    return App("handler", participants=[handler])


class Conflicts:
    """Counts the transition commits that lost a revision race."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0

        def counting(reply: Any) -> Any:
            result = commit_result(reply)
            self.count += result.outcome == "conflict"
            return result

        monkeypatch.setattr(orchestrator_module, "commit_result", counting)


async def settled(client: SagaClient, saga_id: str) -> Any:
    """The saga's state and its history, resolved (read first: the state holds what it refers to)."""
    raw = await client.redis.lrange(PARTITION.history(saga_id), 0, -1)
    state = await client.get(saga_id)
    return state, decode_history(raw, state=state)


def unlimited_bulk(redis: bus.Redis) -> tuple[Saga[Batch], App, FakeClock, SagaClient]:
    """The bulk saga with no concurrency limit, its app, a fake clock and a client."""
    definition = bulk_saga(concurrency=None, limit=10)
    app = App("bulk", sagas=[definition])
    clock = FakeClock()
    return definition, app, clock, SagaClient(redis, app.registry, clock=clock)


async def test_a_stale_orchestrator_decides_again_and_loses_no_branch_result(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    definition, app, clock, client = unlimited_bulk(redis)
    effects: list[tuple[str, str]] = []
    participant = SagaWorker(redis, handler_app(effects), clock=clock, consumer="h")
    first, second = (SagaWorker(redis, app, clock=clock, consumer=c) for c in ("w1", "w2"))
    conflicts = Conflicts(monkeypatch)
    await client.start(definition, Batch(items=[1, 2, 3]), saga_id="s")
    await participant.run_until_idle()  # three replies wait in the inbox
    await first.bus_worker.setup()

    async def run_each(calls: list[ScriptCall | CommandCall]) -> list[object]:
        return [await call.run(redis) for call in calls]

    async def decide_one(worker: SagaWorker) -> None:
        [[_, [(entry_id, fields)]]] = await redis.xreadgroup(
            "orchestrator", worker.bus_worker.consumer, {PARTITION.inbox.key: ">"}, count=1
        )
        envelope = bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32)
        delivery = bus.Delivery(
            envelope=envelope,
            stream=PARTITION.inbox,
            group="orchestrator",
            entry_id=entry_id.decode(),
            deliveries=1,
            consumer=worker.bus_worker.consumer,
            _call=lambda call, retry=True: call.run(redis),  # the worker would batch it; run it alone
            _call_many=lambda calls, retry=True: run_each(calls),
        )
        await worker.orchestrators[0].on_inbox(envelope, delivery)

    await decide_one(second)  # caches the saga at this revision
    await decide_one(first)  # moves it on (the other branch's reply)
    assert conflicts.count == 0
    await decide_one(second)  # decides on its stale cache: conflict, then on fresh state
    assert conflicts.count == 1

    state, raw = await settled(client, "s")
    assert [state.branches[f"each#{i}"].status for i in range(3)] == ["succeeded"] * 3
    assert state.steps["each"].group is not None
    assert state.steps["each"].group.succeeded == 3
    await first.run_until_idle()
    await participant.run_until_idle()  # the step after the fan-in
    await first.run_until_idle()
    state, raw = await settled(client, "s")
    assert state.status == SagaStatus.COMPLETED
    assert replay(definition, raw, saga_id="s") == state
    assert invariant_violations(definition, state, decode_history(raw)) == []


async def test_one_reads_replies_of_one_saga_are_decided_in_turn_without_a_race(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orchestrator's batch decides one entry per saga per round: no revision race."""
    definition, app, clock, client = unlimited_bulk(redis)
    participant = SagaWorker(redis, handler_app([]), clock=clock, consumer="h")
    orchestrator = SagaWorker(redis, app, clock=clock, consumer="w1")
    conflicts = Conflicts(monkeypatch)
    await client.start(definition, Batch(items=[1, 2, 3, 4]), saga_id="s")
    await participant.run_until_idle()  # four replies of one saga wait in the inbox
    assert await redis.xlen(PARTITION.inbox.key) == 4
    await orchestrator.run_until_idle()  # one read: the four replies in one batch
    await participant.run_until_idle()
    await orchestrator.run_until_idle()
    state, raw = await settled(client, "s")
    assert state.status == SagaStatus.COMPLETED
    assert conflicts.count == 0
    assert replay(definition, raw, saga_id="s") == state


async def test_two_workers_racing_on_one_sagas_branches_lose_nothing(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    definition = bulk_saga(concurrency=8, limit=100)
    app = App("bulk", sagas=[definition])
    clock = FakeClock()
    client = SagaClient(redis, app.registry, clock=clock)
    effects: list[tuple[str, str]] = []
    workers = [SagaWorker(redis, app, clock=clock, consumer=c) for c in ("w1", "w2")]
    workers.append(SagaWorker(redis, handler_app(effects), clock=clock, consumer="h"))
    conflicts = Conflicts(monkeypatch)
    items = list(range(60))
    for n in range(3):
        await client.start(definition, Batch(items=items), saga_id=f"s{n}")
    with anyio.fail_after(60):
        for _ in range(500):
            async with anyio.create_task_group() as group:
                for worker in workers:
                    group.start_soon(worker.run_until_idle)
            states = [await client.get(f"s{n}") for n in range(3)]
            if all(s.status.terminal for s in states):
                break
    for n in range(3):
        state, raw = await settled(client, f"s{n}")
        assert state.status == SagaStatus.COMPLETED
        assert [bytes(state.branches[f"each#{i}"].output) for i in items] == [
            msgspec.json.encode(Handled(item=i, total=2 * i)) for i in items
        ]
        assert bytes(state.steps["total"].output) == msgspec.json.encode(
            Reported(total=sum(2 * i for i in items))
        )
        assert replay(definition, raw, saga_id=f"s{n}") == state
        assert invariant_violations(definition, state, decode_history(raw)) == []
    assert sorted(effects) == sorted({(f"s{n}", f"each#{i}") for n in range(3) for i in items})
    print(f"commit conflicts: {conflicts.count} for {3 * len(items)} branches")


@pytest.mark.redis
async def test_a_map_over_1000_items_with_concurrency_20_keeps_its_saga_hash_bounded(
    real_redis: bus.Redis,
) -> None:
    definition = bulk_saga(concurrency=20)
    app = App("bulk", sagas=[definition])
    clock = FakeClock()
    client = SagaClient(redis := real_redis, app.registry, clock=clock)
    effects: list[tuple[str, str]] = []
    orchestrator = SagaWorker(redis, app, clock=clock, consumer="o")
    participant = SagaWorker(redis, handler_app(effects), clock=clock, consumer="h")
    await client.start(definition, Batch(items=list(range(1000))), saga_id="big")
    data_bytes = len(msgspec.json.encode(Batch(items=list(range(1000)))))
    largest = 0
    with anyio.fail_after(120):
        while (await client.get("big")).status != SagaStatus.COMPLETED:
            await participant.run_until_idle()
            await orchestrator.run_until_idle()
            fields = await redis.hgetall(PARTITION.saga("big"))
            largest = max(largest, sum(len(v) for k, v in fields.items() if k != b"data"))
    state, raw = await settled(client, "big")
    assert len(state.branches) == 1000
    assert all(r.status == "succeeded" for r in state.branches.values())
    assert len(effects) == 1000
    # The saga hash (apart from the start data, which holds the 1,000 items) never held more
    # than the group's counters and its 20 branches in flight.
    assert largest < 2_000, largest
    saga_bytes = int(await redis.memory_usage(PARTITION.saga("big"), samples=0))
    branch_bytes = int(await redis.memory_usage(PARTITION.branches("big"), samples=0))
    history_bytes = int(await redis.memory_usage(PARTITION.history("big"), samples=0))
    assert saga_bytes < data_bytes + 3_000
    assert branch_bytes / 1000 < 600
    print(
        f"saga hash {saga_bytes} B (data {data_bytes} B), branch hash {branch_bytes / 1000:.0f} B/branch, "
        f"history {history_bytes / 1000:.0f} B/branch, largest saga hash without data {largest} B"
    )
    assert replay(definition, raw, saga_id="big") == state
