"""Catalogue item 21 on a real 6-node Redis Cluster: a master lost under load, a planned failover,
and the partition's slot moved to another master while workers run.

The fault app's context lives in one partition, so every key of its sagas (hashes, inbox,
command streams, timers) is on the master serving that partition's slot. That master is
killed (SIGKILL) while two worker processes drive a load, or its replica takes over with
``CLUSTER FAILOVER``. The replica is promoted by the cluster itself; workers and the test's
client learn the new slot map from redis-py (``MOVED``, re-read after a lost connection)
without being told. Replication is asynchronous: transitions the dead master acknowledged
but had not sent on are lost (docs/guarantees.md), their entries are redelivered and decided
again, and the participant's own effect records (PostgreSQL, one row per idempotency key)
show every effect applied once, as the G1-G8 checker asserts.

A variant spreads the load over every master: the fault context with six partitions, whose
tags CRC16 places two on each master (``saga.ops.placement``); one of the three loaded masters
is killed, and the sagas of the other four partitions go on while its replica takes over.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bus.lowlevel import owner_of, primaries, slot_of
from saga.ops.placement import placement, spread
from saga.store.keys import Partition, partition_of
from tests.cluster import LocalCluster
from tests.faults.app import CONTEXT
from tests.faults.scenario import Scenario, open_scenario

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.cluster, pytest.mark.postgres]
SAGAS = 150
SPREAD = 6
"""Partitions of the spread variant: two of the fault context's tags on each master."""


async def _master_of_the_load(scenario: Scenario) -> int:
    """The port of the master that serves the fault context's partition now."""
    await primaries(scenario.redis)  # reads the slot map
    owner = owner_of(scenario.redis, slot_of(Partition(CONTEXT.name, 0).inbox.key))
    return int(owner.rpartition(":")[2])


@pytest.mark.parametrize("how", ["sigkill", "cluster-failover"])
async def test_every_saga_ends_once_when_the_master_of_its_partition_fails_over(
    fresh_cluster: LocalCluster, tmp_path: Path, pg_dsn: str, how: str
) -> None:
    async with open_scenario(fresh_cluster.url, pg_dsn, tmp_path / "logs") as scenario:
        ids = await scenario.start(scenario.mixed(SAGAS))
        workers = [await scenario.worker("w1"), await scenario.worker("w2")]
        await scenario.wait_ended(SAGAS // 4, timeout=60)
        master = await _master_of_the_load(scenario)
        replica = fresh_cluster.replica_of(master)
        if how == "sigkill":
            fresh_cluster.kill(master)
            fresh_cluster.wait_promoted(replica)
        else:
            fresh_cluster.failover(replica)
        await scenario.check(ids, timeout=120, dead_letters=0)
        assert all(w.alive for w in workers), "a worker died in the failover"
        assert await _master_of_the_load(scenario) == replica, "the client did not follow the new topology"


async def test_every_saga_ends_once_when_its_partition_moves_to_another_master_under_load(
    fresh_cluster: LocalCluster, tmp_path: Path, pg_dsn: str
) -> None:
    """A reshard with sagas in flight: the slot's keys move one batch at a time (``MIGRATE``),
    commands for moved keys get ``ASK``, scripts whose keys are split get ``TRYAGAIN``."""
    async with open_scenario(fresh_cluster.url, pg_dsn, tmp_path / "logs") as scenario:
        ids = await scenario.start(scenario.mixed(SAGAS))
        workers = [await scenario.worker("w1"), await scenario.worker("w2")]
        await scenario.wait_ended(SAGAS // 4, timeout=60)
        source = await _master_of_the_load(scenario)
        target = next(port for port in fresh_cluster.masters() if port != source)
        slot = slot_of(Partition(CONTEXT.name, 0).inbox.key)
        assert fresh_cluster.move_slot(slot, source, target) > 0
        await scenario.check(ids, timeout=120, dead_letters=0)
        assert all(w.alive for w in workers), "a worker died in the move"
        assert await _master_of_the_load(scenario) == target, "the client did not follow the move"


async def test_every_saga_ends_once_when_one_of_three_loaded_masters_is_killed(
    fresh_cluster: LocalCluster, tmp_path: Path, pg_dsn: str
) -> None:
    async with open_scenario(fresh_cluster.url, pg_dsn, tmp_path / "logs", partitions=SPREAD) as scenario:
        placed = await placement(scenario.redis, CONTEXT.name, SPREAD)
        masters = [fresh_cluster.node_of(port) for port in fresh_cluster.masters()]
        assert spread(placed, masters) == dict.fromkeys(masters, 2)
        ids = await scenario.start(scenario.mixed(SAGAS))
        loaded = {placed[partition_of(saga_id, SPREAD)].node for saga_id in ids}
        assert sorted(loaded) == sorted(masters), "the load does not reach every master"
        workers = [await scenario.worker("w1"), await scenario.worker("w2")]
        await scenario.wait_ended(SAGAS // 4, timeout=60)
        victim = placed[0].node
        replica = fresh_cluster.replica_of(int(victim.rpartition(":")[2]))
        fresh_cluster.kill(int(victim.rpartition(":")[2]))
        fresh_cluster.wait_promoted(replica)
        await scenario.check(ids, timeout=120, dead_letters=0)
        assert all(w.alive for w in workers), "a worker died in the failover"
        lost = [p.partition for p in placed if p.node == victim]
        after = {p.partition: p.node for p in await placement(scenario.redis, CONTEXT.name, SPREAD)}
        assert [after[i] for i in lost] == [fresh_cluster.node_of(replica)] * len(lost), (
            "the client did not follow the new topology"
        )


async def test_a_client_starting_sagas_one_after_another_rides_through_a_master_kill(
    fresh_cluster: LocalCluster, tmp_path: Path, pg_dsn: str
) -> None:
    """The client's side of a failover: starts go on, one after another, through the seconds in
    which the partition's slot has no master (refused connections, then ``CLUSTERDOWN`` until
    the replica is promoted); each call retries until it lands, and every saga ends once."""
    async with open_scenario(fresh_cluster.url, pg_dsn, tmp_path / "logs") as scenario:
        workers = [await scenario.worker("w1"), await scenario.worker("w2")]
        master = await _master_of_the_load(scenario)
        replica = fresh_cluster.replica_of(master)
        ids: list[str] = []
        for n, order in enumerate(scenario.mixed(SAGAS, prefix="steady")):
            if n == SAGAS // 3:
                fresh_cluster.kill(master)
            ids += await scenario.start([order])
        assert fresh_cluster.processes[master].poll() is not None
        fresh_cluster.wait_promoted(replica)
        await scenario.check(ids, timeout=120, dead_letters=0)
        assert all(w.alive for w in workers), "a worker died in the failover"
        assert await _master_of_the_load(scenario) == replica
