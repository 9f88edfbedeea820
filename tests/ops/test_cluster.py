"""redsaga on a real 6-node Redis Cluster: connecting, batches over masters, functions on every
master, the settings check per master, where partitions live, and ``saga demo``.

The contract suites (bus, store) and the scenario table run on the cluster too (marker
``cluster``); this module covers what only a cluster has.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
import redis as redis_sync
from redis.asyncio.connection import SSLConnection

import bus
from bus import BusConfig, FakeClock
from bus._cluster import cluster_client
from bus._epoch import EPOCH_COPIES, check_epoch, join_epoch
from bus._safety import check_redis_settings
from bus._scripts import ReplicaAcks
from bus.lowlevel import (
    CommandCall,
    Script,
    delete_library,
    is_cluster,
    library,
    loaded_libraries,
    owner_of,
    primaries,
    run_batch,
    slot_of,
)
from saga import SagaAdmin, SagaClient
from saga.ops.placement import balancing_moves, placement, spread
from saga.store.keys import Partition
from tests.cluster import LocalCluster, flush

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]


def test_a_cluster_url_names_startup_nodes_credentials_and_tls() -> None:
    client = cluster_client("rediss+cluster://ann:secret@h1:7000,h2:7001?ssl_cert_reqs=none", {})
    assert is_cluster(client)
    assert set(client.nodes_manager.startup_nodes) == {"h1:7000", "h2:7001"}
    kwargs = client.get_connection_kwargs()
    assert (kwargs["username"], kwargs["password"]) == ("ann", "secret")
    assert issubclass(kwargs["connection_class"], SSLConnection)
    assert not is_cluster(bus.connect("redis://127.0.0.1:1/0"))


@pytest.mark.parametrize("url", ["redis+cluster://", "redis+cluster://h1", "redis+cluster://h1:x"])
def test_a_cluster_url_without_host_and_port_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        bus.connect(url)


def _keys_on_every_master(client: bus.Redis, count: int = 3) -> list[str]:
    """Partition inbox keys whose slots are on ``count`` different masters."""
    found: dict[str, str] = {}
    index = 0
    while len(found) < count:
        key = Partition("spread", index).inbox.key
        found.setdefault(owner_of(client, slot_of(key)), key)
        index += 1
    return list(found.values())


async def test_a_batch_over_every_master_keeps_its_order_and_waits_on_each(cluster_redis: bus.Redis) -> None:
    await primaries(cluster_redis)
    keys = _keys_on_every_master(cluster_redis)
    writes = [CommandCall(("SET", key, f"v{n}")) for n, key in enumerate(keys)]
    assert await run_batch(cluster_redis, writes, acks=ReplicaAcks(1, 5_000)) == [True, True, True]
    reads = await run_batch(cluster_redis, [CommandCall(("GET", key)) for key in reversed(keys)])
    assert reads == [b"v2", b"v1", b"v0"]
    late = await run_batch(cluster_redis, writes, acks=ReplicaAcks(2, 50))  # one replica per master
    assert all(isinstance(result, bus.ReplicaAckTimeout) for result in late)


async def test_wait_counts_the_replicas_that_have_this_batchs_writes(
    cluster: LocalCluster, cluster_redis: bus.Redis
) -> None:
    """``WAIT`` on another connection than the writes' would count a stopped replica as caught up."""
    await primaries(cluster_redis)
    keys = _keys_on_every_master(cluster_redis)
    stopped = cluster.replica_of(_port(owner_of(cluster_redis, slot_of(keys[0]))))
    cluster.pause(stopped)
    try:
        writes = [CommandCall(("SET", key, "after")) for key in keys]
        results = await run_batch(cluster_redis, writes, acks=ReplicaAcks(1, 300))
        assert all(isinstance(result, bus.ReplicaAckTimeout) for result in results)
        assert {result.acked for result in results} == {0}
    finally:
        cluster.resume(stopped)
    assert await run_batch(cluster_redis, writes, acks=ReplicaAcks(1, 5_000)) == [True, True, True]


async def test_functions_are_loaded_on_every_master_and_listed_only_when_on_all(
    cluster_redis: bus.Redis,
) -> None:
    await cluster_redis.function_flush()  # on every master
    assert await loaded_libraries(cluster_redis) == []
    ack = Script.load("bus", "ack")
    for key in _keys_on_every_master(cluster_redis):  # each call loads where its key lives
        await ack(cluster_redis, [key], ["group", "0-1"])
    assert [lib.package for lib in await loaded_libraries(cluster_redis)] == ["bus"]
    first = (await primaries(cluster_redis))[0]
    await cluster_redis.execute_command("FUNCTION", "DELETE", library("bus").name, target_nodes=first)  # type: ignore[no-untyped-call]
    assert await loaded_libraries(cluster_redis) == []  # missing on one master: not loaded
    for key in _keys_on_every_master(cluster_redis):
        await ack(cluster_redis, [key], ["group", "0-1"])
    assert [lib.package for lib in await loaded_libraries(cluster_redis)] == ["bus"]
    await delete_library(cluster_redis, library("bus").name)
    assert await loaded_libraries(cluster_redis) == []


async def test_an_unsafe_setting_on_one_master_is_reported(cluster: LocalCluster) -> None:
    client = bus.connect(cluster.url)
    node = redis_sync.Redis(port=cluster.masters()[-1])
    try:
        node.config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(bus.UnsafeRedisConfig, match="maxmemory-policy is allkeys-lru"):
            await check_redis_settings(client, BusConfig())
        problems = await check_redis_settings(client, BusConfig(on_eviction="warn"))
        assert sum("allkeys-lru" in p for p in problems) == 1
    finally:
        node.config_set("maxmemory-policy", "noeviction")
        node.close()
        await client.aclose()


async def test_partitions_are_one_slot_each_and_spread_as_crc16_places_them(
    cluster_redis: bus.Redis,
) -> None:
    masters = [node.name for node in await primaries(cluster_redis)]
    even = await placement(cluster_redis, "orders", 12)
    assert [p.slot for p in even] == [slot_of(f"rs:{{orders:{i}}}:x") for i in range(12)]
    assert sorted(spread(even, masters).values()) == [4, 4, 4]
    assert balancing_moves(even, masters) == []
    uneven = await placement(cluster_redis, "shop", 9)  # P = 3 x masters, yet 2, 2 and 5
    assert sorted(spread(uneven, masters).values()) == [2, 2, 5]
    moves = balancing_moves(uneven, masters)
    assert len(moves) == 2  # 5 -> 3, and one each to the two masters with 2
    assert {m.source for m in moves} == {max(masters, key=lambda m: spread(uneven, masters)[m])}
    assert len({m.target for m in moves}) == 2


def _port(node: str) -> int:
    return int(node.rpartition(":")[2])


@pytest.fixture
async def own_cluster(fresh_cluster: LocalCluster) -> AsyncIterator[tuple[LocalCluster, bus.Redis]]:
    client = bus.connect(fresh_cluster.url)
    await flush(client)
    try:
        yield fresh_cluster, client
    finally:
        await client.aclose()


async def test_moving_a_partition_slot_with_its_keys_evens_the_spread_and_clients_follow(
    own_cluster: tuple[LocalCluster, bus.Redis],
) -> None:
    cluster, client = own_cluster
    masters = [node.name for node in await primaries(client)]
    placed = await placement(client, "shop", 9)
    for p in placed:  # every partition holds entries when its slot moves
        await client.xadd(Partition("shop", p.partition).inbox.key, {"n": str(p.partition)})
    for move in balancing_moves(placed, masters):
        assert cluster.move_slot(move.slot, _port(move.source), _port(move.target)) >= 1
    fresh = bus.connect(cluster.url)
    counts = spread(await placement(fresh, "shop", 9), masters)
    await fresh.aclose()
    assert max(counts.values()) - min(counts.values()) <= 1, counts
    for p in placed:  # the old client learns the moves from MOVED replies
        assert await client.xlen(Partition("shop", p.partition).inbox.key) == 1


def test_demo_on_the_cluster_ends_every_saga_and_balances_the_ledger(cluster: LocalCluster) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "redsaga.cli", "demo", "--orders", "40", "--redis-url", cluster.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "40 orders in" in completed.stdout
    assert "ledger balanced: yes" in completed.stdout
    assert "stock released: yes" in completed.stdout


async def test_stats_show_each_masters_partitions_streams_keys_and_memory(cluster_redis: bus.Redis) -> None:
    from tests.saga.test_partition_subset import APP, Job, job

    clock = FakeClock()
    client = SagaClient(cluster_redis, APP.registry, clock=clock)
    for n in range(8):
        await client.start(job, Job(id=f"job-{n}"), saga_id=f"job-{n}")
    found = await SagaAdmin(cluster_redis, APP, clock=clock).stats()
    masters = {node.name for node in await primaries(cluster_redis)}
    assert {n.node for n in found.nodes} == masters
    assert sum(n.partitions for n in found.nodes) == 4
    owners = [owner_of(cluster_redis, p.slot) for p in await placement(cluster_redis, "split", 4)]
    assert {n.node: n.partitions for n in found.nodes} == {m: owners.count(m) for m in masters}
    assert sum(n.streams for n in found.nodes) == len(found.streams)
    assert all(n.used_memory_bytes > 0 for n in found.nodes)
    assert sum(n.keys for n in found.nodes) >= 8  # a hash per saga at least


async def test_every_master_holds_a_copy_of_the_epoch_and_one_restarted_empty_is_detected(
    own_cluster: tuple[LocalCluster, bus.Redis],
) -> None:
    """``rs:epoch`` is on one master: a copy on each other master catches one that lost its data."""
    _, client = own_cluster
    epoch = await join_epoch(client)
    masters = {node.name for node in await primaries(client)}
    assert {owner_of(client, slot_of(key)) for key in EPOCH_COPIES} == masters
    await check_epoch(client, epoch)
    assert await join_epoch(client) == epoch  # a later worker joins the same epoch
    emptied = next(m for m in masters if m != owner_of(client, slot_of(bus.EPOCH_KEY)))
    with redis_sync.Redis(port=_port(emptied)) as node:
        node.flushall()  # a master restarted without its data; rs:epoch's master kept it
    with pytest.raises(bus.RedisDataLost):
        await check_epoch(client, epoch)
    with pytest.raises(bus.RedisDataLost):  # workers started later refuse too
        await join_epoch(client)
    accepted = await bus.accept_epoch(client)  # the operator decides to go on
    await check_epoch(client, accepted)
    assert await join_epoch(client) == accepted
