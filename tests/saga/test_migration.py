"""Migrations: in-process on the runner (the plan rules), and on Redis (atomic per saga, dry runs)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import bus
from bus import FakeClock
from saga import (
    EngineConfig,
    Instance,
    Plan,
    SagaClient,
    SagaStatus,
    SagaWorker,
    Versions,
    migration,
    run_migration,
)
from saga.core.model import Migrated
from saga.errors import MigrationRefused
from saga.store.codec import decode_state
from saga.testing import FakeParticipant, SagaRunner, decode_history, replay
from saga.versions.migrator import _commit
from tests.helpers import keys_matching
from tests.saga.versioned import (
    V1,
    V2,
    Charged,
    Order,
    Reserved,
    Shipped,
    app_migrating,
    app_v1,
    build,
    v1_to_v2,
)

ORDER = Order(id="o1", total=100)


def fakes() -> list[FakeParticipant]:
    from tests.saga.versioned import Charge, Refund, Release, Reserve, Ship

    return [
        FakeParticipant("stock", {Reserve: Reserved(reservation="r"), Release: None}),
        FakeParticipant("bank", {Charge: Charged(charge="c"), Refund: None}),
        FakeParticipant("post", {Ship: Shipped(tracking="t")}),
    ]


def runner_at(step: str, *definitions: Any, saga_id: str = "s1") -> SagaRunner:
    """A runner whose v1 saga waits at ``step`` (that step's participant is down)."""
    participants = fakes()
    runner = SagaRunner(*(definitions or (V1, V2)), participants=participants)
    runner.pause({"reserve": "stock", "charge": "bank", "ship": "post"}[step])
    runner.start(ORDER, definition=V1, saga_id=saga_id)
    runner.run_until_idle()
    assert V1.steps[runner.state(saga_id).cursor].name == step
    return runner


# -- the plan rules, in-process ------------------------------------------------------------


def test_a_saga_before_an_inserted_step_moves_and_then_runs_it() -> None:
    runner = runner_at("charge")
    [decision] = runner.migrate(v1_to_v2).values()
    assert decision.outcome == "migrate"
    state = runner.state("s1")
    assert state.version == 2
    assert set(state.steps) == {"reserve", "charge", "gift_wrap", "ship"}
    runner.resume("bank")
    runner.run_until_settled("s1")
    final = runner.state("s1")
    assert final.status == SagaStatus.COMPLETED
    assert final.completed == ["reserve", "charge", "gift_wrap", "ship"]
    runner.assert_invariants()

    [migrated] = [e for e in runner.history("s1") if isinstance(e.event, Migrated)]
    assert migrated.event.steps == {"reserve": "reserve", "charge": "charge", "ship": "ship"}
    assert (migrated.event.from_version, migrated.event.to_version) == (1, 2)
    assert migrated.event.reason == "gift wrapping"
    assert runner.replay("s1").status == SagaStatus.COMPLETED  # replay switches versions too


def test_a_saga_past_an_inserted_step_must_skip_it_explicitly() -> None:
    runner = runner_at("ship")

    @migration(V1, V2)
    def without_skip(instance: Instance[Order]) -> Plan:
        return Plan()

    [refused] = runner.migrate(without_skip).values()
    assert refused.outcome == "refused"
    assert "step 'gift_wrap' comes before where the saga is and it has not run" in refused.reason
    assert runner.state("s1").version == 1

    [moved] = runner.migrate(v1_to_v2).values()  # skips gift_wrap for sagas at ship
    assert moved.outcome == "migrate"
    runner.resume("post")
    runner.run_until_settled("s1")
    assert runner.state("s1").status == SagaStatus.COMPLETED
    assert runner.state("s1").steps["gift_wrap"].status == "pending"


RENAMED = build(
    version=2,
    steps=("reserve", "pay", "ship"),
    undo={"reserve": "release", "pay": "refund"},
    aliases={"pay": "charge"},
)


@migration(V1, RENAMED)
def rename_charge(instance: Instance[Order]) -> Plan:
    return Plan(steps={"charge": "pay"})


def test_a_renamed_step_is_mapped_once_it_has_settled_but_not_while_in_flight() -> None:
    in_flight = runner_at("charge", V1, RENAMED)
    [refused] = in_flight.migrate(rename_charge).values()
    assert refused.outcome == "refused"
    assert "step 'charge' has an attempt or a timer in flight" in refused.reason
    assert "keep its name" in refused.reason

    settled = runner_at("ship", V1, RENAMED)
    [moved] = settled.migrate(rename_charge).values()
    assert moved.outcome == "migrate"
    state = settled.state("s1")
    assert state.completed == ["reserve", "pay"]
    settled.cancel("s1")  # a cancel after the migration undoes 'pay' with its new name
    settled.resume("post")
    settled.run_until_settled("s1")
    assert settled.state("s1").status == SagaStatus.CANCELLED
    assert settled.state("s1").steps["pay"].status == "compensated"


@pytest.mark.parametrize(
    ("target", "plan", "reason"),
    [
        (build(version=2, steps=("reserve", "ship")), Plan(), "step 'charge' has run: map it"),
        (
            build(version=2, undo={"charge": "refund"}),
            Plan(),
            "completed step 'reserve' must still be undoable",
        ),
        (V2, Plan(data={"id": "o1"}), "not a valid Order"),
        (V2, Plan(steps={"nope": "x"}), "maps steps ['nope']"),
        (V2, Plan(outputs={"reserve": {"wrong": 1}}), "not a valid Reserved"),
    ],
    ids=["completed-step-dropped", "compensation-dropped", "bad-data", "unknown-step", "bad-output"],
)
def test_plans_that_would_strand_a_saga_are_refused(target: Any, plan: Plan, reason: str) -> None:
    runner = runner_at("ship", V1, target)
    chosen = migration(V1, target)(lambda _instance: plan)
    [refused] = runner.migrate(chosen).values()
    assert refused.outcome == "refused"
    assert reason in refused.reason
    assert runner.state("s1").version == 1


def test_the_function_sees_the_instance_as_the_source_version_wrote_it() -> None:
    runner = runner_at("ship")
    seen: list[Any] = []

    @migration(V1, V2)
    def look(instance: Instance[Order]) -> None:
        seen.extend([instance.data, instance.current, instance.completed, instance.output("reserve")])

    [skipped] = runner.migrate(look).values()
    assert skipped.outcome == "skipped"
    assert seen == [ORDER, "ship", ("reserve", "charge"), Reserved(reservation="r")]


def test_the_function_reads_a_completed_maps_output_as_its_list() -> None:
    """A map's list is never stored; the instance builds it as ``ctx.output`` does."""
    from saga import Command, Saga, command
    from saga.testing import succeed

    class Items(msgspec.Struct, frozen=True):
        names: list[str]

    class Mark(msgspec.Struct, tag=True, frozen=True):
        name: str

    def batch(version: int) -> Saga[Items]:
        saga: Saga[Items] = Saga("batch", version=version, context="shop", data=Items)

        @saga.map(items=lambda items: items.names, reply=Mark)
        def each(_data: Items, name: str) -> Command:
            return command("marker", Mark(name=name))

        saga.wait_signal("approve")
        return saga

    old, new = batch(1), batch(2)
    runner = SagaRunner(old, new, participants=[FakeParticipant("marker", {Mark: succeed(lambda m: m)})])
    runner.start(Items(names=["a", "b"]), definition=old, saga_id="b1")
    runner.run_until_idle()
    seen: list[Any] = []

    @migration(old, new)
    def look(instance: Instance[Items]) -> None:
        seen.append(instance.output("each"))

    [skipped] = runner.migrate(look).values()
    assert skipped.outcome == "skipped"
    assert seen == [[Mark(name="a"), Mark(name="b")]]


def test_a_migration_goes_to_a_later_version_of_the_same_saga() -> None:
    with pytest.raises(ValueError, match="later version"):
        migration(V2, V1)(lambda _i: Plan())


# -- on Redis ------------------------------------------------------------------------------

CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))


async def everything(redis: bus.Redis) -> dict[bytes, Any]:
    """Every key and its value: the whole database, to compare before and after."""
    values: dict[bytes, Any] = {}
    for key in await keys_matching(redis, "*"):
        kind = (await redis.type(key)).decode()
        if kind == "hash":
            values[key] = await redis.hgetall(key)
        elif kind == "list":
            values[key] = await redis.lrange(key, 0, -1)
        elif kind == "zset":
            values[key] = await redis.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            values[key] = await redis.smembers(key)
        elif kind == "stream":
            values[key] = await redis.xrange(key)
        else:
            values[key] = await redis.get(key)
    return values


async def sagas_in_flight(redis: bus.Redis, clock: FakeClock) -> SagaClient:
    """Three v1 sagas waiting at charge (the bank is down), and a worker serving v1 and v2."""
    from saga import App
    from tests.saga.versioned import stock

    client = SagaClient(redis, app_migrating.registry, clock=clock)
    for saga_id in ("s1", "s2", "refuse-1"):
        await client.start(V1, ORDER, saga_id=saga_id)
    await SagaWorker(
        redis, App("shop", sagas=[V1], participants=[stock]), config=CONFIG, clock=clock
    ).run_until_idle()
    await SagaWorker(redis, app_migrating, config=CONFIG, clock=clock, consumer="w").register()
    return client


@pytest.mark.anyio
async def test_a_dry_run_changes_nothing(redis: bus.Redis) -> None:
    clock = FakeClock()
    await sagas_in_flight(redis, clock)
    before = await everything(redis)
    report = await run_migration(redis, v1_to_v2, dry_run=True, clock=clock)
    assert sorted((r.saga_id, r.outcome) for r in report.results) == [
        ("refuse-1", "refused"),
        ("s1", "would_migrate"),
        ("s2", "would_migrate"),
    ]
    assert report.remaining == 3
    assert await everything(redis) == before


@pytest.mark.anyio
async def test_migrated_sagas_record_it_and_finish_on_the_new_version(redis: bus.Redis) -> None:
    clock = FakeClock()
    client = await sagas_in_flight(redis, clock)
    refused_before = await redis.hgetall("rs:{shop:0}:saga:refuse-1")
    refused_history = await redis.lrange("rs:{shop:0}:hist:refuse-1", 0, -1)

    report = await run_migration(redis, v1_to_v2, by="ops", clock=clock)
    assert not report.ok
    outcomes = {r.saga_id: (r.outcome, r.step, r.to_step) for r in report.results}
    assert outcomes == {
        "s1": ("migrated", "charge", "charge"),
        "s2": ("migrated", "charge", "charge"),
        "refuse-1": ("refused", "charge", ""),
    }
    assert "ValueError: this order is special" in next(
        r.reason for r in report.results if r.outcome == "refused"
    )
    assert report.remaining == 1
    # the refused saga is untouched, byte for byte
    assert await redis.hgetall("rs:{shop:0}:saga:refuse-1") == refused_before
    assert await redis.lrange("rs:{shop:0}:hist:refuse-1", 0, -1) == refused_history

    moved = await client.get("s1")
    assert moved.version == 2
    history = decode_history(await redis.lrange("rs:{shop:0}:hist:s1", 0, -1), state=moved)
    last = history[-1]
    assert isinstance(last.event, Migrated)
    assert (last.event.by, last.revision) == ("ops", moved.revision)
    counts = await client.counts()
    assert counts[("shop_order@1", "running")] == 1
    assert counts[("shop_order@2", "running")] == 2

    await SagaWorker(redis, app_migrating, config=CONFIG, clock=clock, consumer="w").run_until_idle()
    done = await client.get("s1")
    assert (done.version, done.status) == (2, SagaStatus.COMPLETED)
    assert done.steps["gift_wrap"].status == "succeeded"
    full = await redis.lrange("rs:{shop:0}:hist:s1", 0, -1)
    assert replay(app_migrating.registry, full, saga_id="s1", state=done).status == SagaStatus.COMPLETED
    refused = await client.get("refuse-1")  # served beside v2, it ended on v1
    assert (refused.version, refused.status) == (1, SagaStatus.COMPLETED)
    again = await run_migration(redis, v1_to_v2, clock=clock)
    assert (again.results, again.remaining) == ([], 0)


@pytest.mark.anyio
async def test_the_migrate_script_refuses_a_saga_that_moved_since_it_was_read(redis: bus.Redis) -> None:
    clock = FakeClock()
    client = await sagas_in_flight(redis, clock)
    partition = client._partition("shop", "s1")
    stale = decode_state(
        "s1", await redis.hgetall(partition.saga("s1")), context=partition.context, partition=partition.index
    )
    await client.cancel("s1")  # the saga moves on: its revision changes
    await SagaWorker(redis, app_v1, config=CONFIG, clock=clock, consumer="x").run_until_idle()
    before = await everything(redis)

    from saga.core.history_entry import HistoryEntry
    from saga.core.migration import decide_migration

    decision = decide_migration(v1_to_v2, stale.state, event_id="m1", at_ms=clock.now_ms(), by="t")
    assert decision.state is not None
    assert decision.event is not None
    entry = HistoryEntry(event=decision.event, status=stale.state.status, revision=stale.state.revision + 1)
    committed = await _commit(
        redis, partition=partition, loaded=stale, new_state=decision.state, entry=entry, clock=clock
    )
    assert committed is False
    assert await everything(redis) == before


@pytest.mark.anyio
async def test_a_migration_onto_a_version_no_worker_serves_or_a_drained_one_is_refused(
    redis: bus.Redis,
) -> None:
    clock = FakeClock()
    await sagas_in_flight(redis, clock)
    await Versions(redis, clock=clock).leave("shop", "w")
    with pytest.raises(MigrationRefused, match="no running worker serves shop_order@2"):
        await run_migration(redis, v1_to_v2, clock=clock)
    await Versions(redis, clock=clock).drain("shop_order", 2)
    with pytest.raises(MigrationRefused, match="shop_order@2 is drained"):
        await run_migration(redis, v1_to_v2, clock=clock)
    assert msgspec.json.encode(
        await SagaClient(redis, app_migrating.registry).get("s1")
    )  # untouched, readable
