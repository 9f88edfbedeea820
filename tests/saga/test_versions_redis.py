"""Versions at run time, on fakeredis and real Redis: pinned sagas, the shape registry, drain,
decommission, workers refusing incompatible code, stranded sagas, and replay per version."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

import bus
from bus import FakeClock
from saga import (
    App,
    Context,
    EngineConfig,
    InvalidInput,
    Registry,
    SagaClient,
    SagaStatus,
    SagaWorker,
    Versions,
)
from saga.definition.shape import shape_of
from saga.errors import IncompatibleChange, VersionDrained, VersionError, VersionInUse
from saga.store.keys import CONTEXTS, ContextKeys, Partition
from saga.testing import decode_history, replay
from saga.versions.records import RegistrySnapshot, check_registry
from saga.versions.registry import stranded_instances
from tests.helpers import keys_matching
from tests.saga.versioned import (
    V1,
    V1_APPENDED,
    V1_BROKEN,
    V2,
    Order,
    app_appended,
    app_broken,
    app_v1,
    app_v1_v2,
    app_v2_only,
    bank,
    build,
    post,
    stock,
)

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
ORDER = Order(id="o1", total=100)
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000), registration_ttl_ms=30_000, heartbeat_ms=10_000)
SHOP = Partition("shop", 0)


def worker(redis: bus.Redis, app: App, clock: FakeClock, consumer: str = "w1") -> SagaWorker:
    return SagaWorker(redis, app, config=CONFIG, clock=clock, consumer=consumer)


async def start_waiting_at_charge(redis: bus.Redis, clock: FakeClock, saga_id: str = "s1") -> SagaClient:
    """A v1 saga in flight: stock answered, the bank is down, so it waits at 'charge'."""
    client = SagaClient(redis, Registry([V1]), clock=clock)
    await client.start(V1, ORDER, saga_id=saga_id)
    await worker(redis, App("shop", sagas=[V1], participants=[stock]), clock, "old").run_until_idle()
    state = await client.get(saga_id)
    assert state.steps["charge"].status == "dispatched"
    return client


# -- pinned sagas --------------------------------------------------------------------------


async def test_a_v1_saga_mid_flight_finishes_on_v1_after_v2_is_deployed_beside_it(redis: bus.Redis) -> None:
    clock = FakeClock()
    await start_waiting_at_charge(redis, clock)

    # deploy v2 beside v1: one worker serves both versions, and the bank is back
    client = SagaClient(redis, app_v1_v2.registry, clock=clock)
    v2_id = await client.start("shop_order", ORDER, saga_id="s2")  # the newest version
    await worker(redis, app_v1_v2, clock, "new").run_until_idle()

    old = await client.get("s1")
    assert (old.version, old.status) == (1, SagaStatus.COMPLETED)
    assert set(old.steps) == {"reserve", "charge", "ship"}  # v1's steps, not v2's gift_wrap
    new = await client.get(v2_id)
    assert (new.version, new.status) == (2, SagaStatus.COMPLETED)
    assert new.steps["gift_wrap"].status == "succeeded"

    counts = await client.counts()
    assert counts[("shop_order@1", "completed")] == 1
    assert counts[("shop_order@2", "completed")] == 1


async def test_new_sagas_start_on_the_newest_version_unless_one_is_requested(redis: bus.Redis) -> None:
    client = SagaClient(redis, app_v1_v2.registry)
    assert (await client.get(await client.start("shop_order", ORDER))).version == 2
    assert (await client.get(await client.start("shop_order", ORDER, version=1))).version == 1
    assert (await client.get(await client.start(V1, ORDER))).version == 1
    with pytest.raises(InvalidInput, match="contradicts"):
        await client.start(V1, ORDER, version=2)


async def test_replay_of_a_v1_history_uses_the_v1_definition(redis: bus.Redis) -> None:
    clock = FakeClock()
    await start_waiting_at_charge(redis, clock)
    await worker(redis, app_v1_v2, clock).run_until_idle()
    stored = await SagaClient(redis, app_v1_v2.registry, clock=clock).get("s1")
    history = decode_history(await redis.lrange(SHOP.history("s1"), 0, -1), state=stored)
    assert history[0].event.saga == "shop_order@1"  # type: ignore[union-attr]

    state = replay(app_v1_v2.registry, history, saga_id="s1")  # v2 is newer; v1 is used
    assert (state.version, state.status) == (1, SagaStatus.COMPLETED)
    with pytest.raises(ValueError, match=r"replay needs shop_order@1 \(the history started on it\)"):
        replay([V2], history, saga_id="s1")


async def test_a_step_appended_to_a_running_version_is_skipped_by_sagas_started_before_it(
    redis: bus.Redis,
) -> None:
    """The safe change: in-flight sagas end as they started; new ones run the new step."""
    clock = FakeClock()
    await start_waiting_at_charge(redis, clock)
    client = SagaClient(redis, app_appended.registry, clock=clock)
    await client.start(V1_APPENDED, ORDER, saga_id="after")
    await worker(redis, app_appended, clock, "new").run_until_idle()
    before = await client.get("s1")
    assert before.status == SagaStatus.COMPLETED
    assert "notify" not in before.steps
    after = await client.get("after")
    assert after.steps["notify"].status == "succeeded"
    history = await redis.lrange(SHOP.history("s1"), 0, -1)
    assert (
        replay(V1_APPENDED, history, saga_id="s1", state=before).status == SagaStatus.COMPLETED
    )  # replay stays exact


# -- the shape registry --------------------------------------------------------------------


async def test_a_worker_registers_its_shapes_when_it_starts_and_again_changes_nothing(
    redis: bus.Redis,
) -> None:
    clock = FakeClock()
    w = worker(redis, app_v1_v2, clock)
    report = await w.register()
    assert sorted(report.added) == ["shop_order@1", "shop_order@2"]
    versions = Versions(redis, clock=clock)
    shapes = await versions.shapes("shop")
    assert shapes == {"shop_order@1": shape_of(V1), "shop_order@2": shape_of(V2)}
    assert await redis.smembers(CONTEXTS) == {b"shop"}
    info = await redis.hgetall(ContextKeys("shop").info)
    assert set(info) == {b"shop_order@1", b"shop_order@2"}

    again = await worker(redis, app_v1_v2, clock, "w2").register()
    assert (again.added, again.changed, again.replaced) == ([], [], [])
    assert await redis.hgetall(ContextKeys("shop").info) == info


async def test_a_safe_change_updates_the_registered_shape(redis: bus.Redis) -> None:
    clock = FakeClock()
    await worker(redis, app_v1, clock).register()
    await start_waiting_at_charge(redis, clock)
    report = await worker(redis, app_appended, clock).register()
    assert [c.rule for c in report.changed] == ["step-appended"]
    assert (await Versions(redis).shapes("shop"))["shop_order@1"] == shape_of(V1_APPENDED)


async def test_a_worker_with_an_incompatible_change_to_a_version_in_flight_refuses_to_start(
    redis: bus.Redis,
) -> None:
    clock = FakeClock()
    await worker(redis, app_v1, clock).register()
    await start_waiting_at_charge(redis, clock)
    before = await redis.hgetall(ContextKeys("shop").shapes)
    started: list[str] = []

    async def on_start() -> None:
        started.append("on_start")

    app = App("shop", sagas=[V1_BROKEN], participants=[stock, bank, post], on_start=[on_start])
    with pytest.raises(IncompatibleChange) as refused:
        await worker(redis, app, clock).run()
    message = str(refused.value)
    assert "refusing to start" in message
    assert "shop_order@1" in message
    assert "1 on shop_order@1" in message  # how many sagas are in flight on it
    assert refused.value.problems == ["shop_order@1: step 'charge' was removed: make this version 2"]
    assert (refused.value.saga, refused.value.version) == ("shop_order", 1)
    assert started == []  # nothing ran
    assert await redis.hgetall(ContextKeys("shop").shapes) == before  # nothing registered


async def test_an_incompatible_change_to_a_version_with_nothing_in_flight_replaces_its_shape(
    redis: bus.Redis,
) -> None:
    clock = FakeClock()
    await worker(redis, app_v1, clock).register()
    with capture_logs() as logs:
        report = await worker(redis, app_broken, clock).register()
    assert [c.rule for c in report.replaced] == ["step-removed"]
    assert (await Versions(redis).shapes("shop"))["shop_order@1"] == shape_of(V1_BROKEN)
    assert any(log["log_level"] == "warning" and "replaced" in log["event"] for log in logs)


async def test_check_against_redis_and_against_a_snapshot_agree(redis: bus.Redis) -> None:
    clock = FakeClock()
    await worker(redis, app_v1, clock).register()
    versions = Versions(redis, clock=clock)
    live = await versions.check(app_broken.registry)
    assert [c.line() for c in live if c.breaking] == [
        "shop_order@1: step 'charge' was removed: make this version 2"
    ]
    assert await versions.check(app_appended.registry) == await versions.check(app_appended.registry)
    assert not [c for c in await versions.check(app_appended.registry) if c.breaking]

    snapshot = await versions.snapshot()
    on_disk = msgspec.json.decode(msgspec.json.encode(snapshot), type=RegistrySnapshot)
    assert check_registry(on_disk, app_broken.registry) == live


# -- drain and decommission ----------------------------------------------------------------


async def test_drain_blocks_new_starts_on_the_version_in_every_partition(redis: bus.Redis) -> None:
    multi = build(context=Context("multi", partitions=4))
    newer = build(version=2, context=Context("multi", partitions=4))
    app = App("multi", sagas=[multi, newer])
    clock = FakeClock()
    await worker(redis, app, clock).register()
    client = SagaClient(redis, app.registry, clock=clock)
    await client.start(multi, ORDER, saga_id="running")
    versions = Versions(redis, clock=clock)

    note = await versions.drain("shop_order", 1, by="ops", reason="v2 is out")
    assert (note.by, note.reason) == ("ops", "v2 is out")
    for n in range(12):  # ids land in all four partitions
        with pytest.raises(VersionDrained, match="shop_order@1 is drained"):
            await client.start(multi, ORDER, saga_id=f"new-{n}")
    assert (
        len(await keys_matching(redis, "rs:{multi:*}:saga:*")) == 1
    )  # only the saga started before the drain
    assert await client.start(multi, ORDER, saga_id="running") == "running"  # not a new start
    assert (await client.get(await client.start("shop_order", ORDER))).version == 2  # v2 is open

    await versions.undrain("shop_order", 1)
    assert (await client.get(await client.start(multi, ORDER, saga_id="new-0"))).version == 1


async def test_decommission_is_refused_while_sagas_are_in_flight_and_allowed_once_empty(
    redis: bus.Redis,
) -> None:
    clock = FakeClock()
    await worker(redis, app_v1, clock).register()
    await start_waiting_at_charge(redis, clock)
    versions = Versions(redis, clock=clock)

    with pytest.raises(VersionError, match="drain it first"):
        await versions.decommission("shop_order", 1)
    await versions.drain("shop_order", 1)
    with pytest.raises(VersionInUse, match="shop_order@1 has 1 sagas in flight") as in_use:
        await versions.decommission("shop_order", 1)
    assert in_use.value.in_flight == 1
    assert "shop_order@1" in await versions.shapes("shop")

    await worker(redis, app_v1, clock, "w2").run_until_idle()  # the bank is back: the saga ends
    await versions.decommission("shop_order", 1)
    assert await versions.shapes("shop") == {}
    [row] = await versions.status("shop")
    assert (row.registered, row.in_flight, row.counts) == (False, 0, {"completed": 1})
    assert row.drained is not None  # old clients still cannot start it
    with pytest.raises(VersionDrained):
        await SagaClient(redis, app_v1.registry).start(V1, ORDER)


async def test_unknown_versions_are_reported_by_name(redis: bus.Redis) -> None:
    with pytest.raises(Exception, match=r"nope@1 is not registered in any context"):
        await Versions(redis).drain("nope", 1)


# -- workers and stranded sagas ------------------------------------------------------------


async def test_sagas_on_a_version_no_live_worker_serves_are_reported_and_logged(redis: bus.Redis) -> None:
    clock = FakeClock()
    await start_waiting_at_charge(redis, clock)
    only_v2 = worker(redis, app_v2_only, clock, "v2-worker")
    await only_v2.register()
    with capture_logs() as logs:
        [stranded] = await only_v2.check_stranded()
    assert (stranded.saga, stranded.version, stranded.in_flight) == ("shop_order", 1, 1)
    assert stranded.counts == {"running": 1}
    assert "no running worker serves this version" in stranded.line()
    [log] = [entry for entry in logs if entry["log_level"] == "error"]
    assert log["definition"] == "shop_order@1"

    v1_worker = worker(redis, app_v1, clock, "v1-worker")
    await v1_worker.register()
    assert await stranded_instances(redis, clock=clock) == []
    rows = {r.key: r for r in await Versions(redis, clock=clock).status()}
    assert rows["shop_order@1"].workers == 1
    assert rows["shop_order@2"].workers == 1

    clock.advance(31)  # both registrations expire; v2's worker renews, v1's is gone
    await only_v2.heartbeat()
    assert [s.version for s in await stranded_instances(redis, clock=clock)] == [1]
    await v1_worker.heartbeat()
    assert await stranded_instances(redis, ["shop"], clock=clock) == []
    await Versions(redis, clock=clock).leave("shop", "v1-worker")  # a graceful stop
    assert [s.version for s in await stranded_instances(redis, clock=clock)] == [1]


async def test_listing_workers_only_reads(redis: bus.Redis) -> None:
    """A read-only operator user may run ``saga versions list``: listing skips an expired
    registration without removing it (the next heartbeat does)."""
    clock = FakeClock()
    w = worker(redis, app_v1, clock)
    await w.register()
    keys = ContextKeys("shop")

    async def stored() -> tuple[object, object]:
        return await redis.zrange(keys.workers, 0, -1, withscores=True), await redis.hgetall(keys.served)

    before = await stored()
    clock.advance(31)
    assert await Versions(redis, clock=clock).workers("shop") == []
    assert await stored() == before


async def test_a_worker_heartbeats_while_it_runs_and_withdraws_when_it_stops(redis: bus.Redis) -> None:
    import anyio

    clock = FakeClock()
    w = worker(redis, app_v1, clock)
    versions = Versions(redis, clock=clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(w.run)
        await w.started.wait()
        [info] = await versions.workers("shop")
        assert (info.id, info.serves) == ("w1", ["shop_order@1"])
        clock.advance(29)
        clock.advance(2)  # past the first registration's expiry: the heartbeat renewed it
        await _until(lambda: _live(versions), True)
        w.stop()
    assert await versions.workers("shop") == []


async def _live(versions: Versions) -> bool:
    return bool(await versions.workers("shop"))


async def _until(check: Any, expected: object) -> None:
    import anyio

    for _ in range(1000):
        if await check() == expected:
            return
        await anyio.lowlevel.checkpoint()
    raise AssertionError("condition not reached")


async def test_registration_waits_out_a_redis_outage(fake_redis: bus.Redis) -> None:
    """A worker that starts while Redis is unreachable retries with back-off, as the bus does."""
    import anyio
    from redis import exceptions as rx

    class Flaky:
        def __init__(self, inner: bus.Redis, failures: int) -> None:
            self.inner, self.failures = inner, failures

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def sadd(self, *args: Any) -> Any:
            if self.failures:
                self.failures -= 1
                raise rx.ConnectionError("connection refused")
            return await self.inner.sadd(*args)

    clock = FakeClock()
    flaky = Flaky(fake_redis, failures=3)
    w = SagaWorker(flaky, app_v1, config=CONFIG, clock=clock, consumer="w")  # type: ignore[arg-type]
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            tg.start_soon(w.register)
            while flaky.failures or not await fake_redis.exists(ContextKeys("shop").shapes):
                clock.advance(1)
                await anyio.lowlevel.checkpoint()
    assert sum("retrying" in log["event"] for log in logs) == 3
    assert "shop_order@1" in await Versions(fake_redis).shapes("shop")


async def test_a_participant_that_knows_fewer_partitions_than_registered_refuses_to_start(
    redis: bus.Redis,
) -> None:
    from saga.errors import PartitionMismatch
    from tests.saga.nap_sagas import NAPS, nap, recorder

    clock = FakeClock()
    await SagaWorker(redis, App("naps", sagas=[nap]), clock=clock).register()  # 4 partitions
    one_partition = recorder(redis)
    one_partition.serves = [Context(NAPS.name)]  # as Participant("recorder", serves=["naps"]) would
    with pytest.raises(PartitionMismatch, match=r"registered with 4.*partitions=4") as refused:
        await SagaWorker(redis, App("recorder", participants=[one_partition]), clock=clock).register()
    found = refused.value
    assert (found.participant, found.context, found.partitions, found.registered) == (
        "recorder",
        NAPS.name,
        1,
        4,
    )
    assert (
        await SagaWorker(redis, App("recorder", participants=[recorder(redis)]), clock=clock).register()
    ) is not None
