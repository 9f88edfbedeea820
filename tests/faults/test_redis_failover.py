"""Catalogue item 20: failover to a replica that lagged behind the master.

A master and a replica on loopback; the replica is stopped (SIGSTOP) while sagas progress
on the master, the master is killed, and the replica's data is promoted onto the master's
port. (The stopped replica is killed and restarted as a master from its AOF rather than
resumed: resumed, it would first read what the kernel still buffered from the dead
master's link, and lag far less than a real one.) The transitions only the master saw
are gone: sagas go back to what the replica holds, their
pending entries are redelivered and decided again, commands go out again with the same
idempotency keys, and the participants' dedupe keeps one effect per key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import bus
from bus import BusConfig
from saga import EngineConfig, SagaClient, SagaNotFound
from tests.faults.app import REGISTRY, Order, order
from tests.faults.scenario import open_scenario
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]
SAGAS = 200


async def synced_pair(tmp_path: Path) -> tuple[PrivateRedis, PrivateRedis]:
    """A master (AOF everysec) and its replica, started and in sync."""
    master = PrivateRedis(tmp_path / "master", appendfsync="everysec")
    replica = master.replica(tmp_path / "replica")
    await master.start()
    await replica.start()
    await replica.wait_synced()
    return master, replica


@pytest.mark.postgres
async def test_failover_to_a_lagging_replica_redrives_lost_transitions_once(
    tmp_path: Path, pg_dsn: str
) -> None:
    master, replica = await synced_pair(tmp_path)
    promoted = replica
    try:
        async with open_scenario(master.url, pg_dsn, tmp_path / "logs") as scenario:
            ids = await scenario.start(scenario.mixed(SAGAS))
            assert (
                await scenario.redis.execute_command("WAIT", 1, 10_000) == 1
            )  # the starts reached the replica
            workers = [await scenario.worker("w1"), await scenario.worker("w2")]
            await scenario.wait_ended(SAGAS // 5)
            replica.pause()  # the replica lags from here on
            await scenario.wait_ended(await scenario.ended() + SAGAS // 5)
            ended_on_master = await scenario.ended()
            for worker in workers:  # held still until the promoted copy is counted: once
                worker.stop()  # reconnected they re-drive sagas to their end within moments
            master.kill()
            replica.kill()
            promoted = replica.promoted(master.port)
            await promoted.start()
            assert await scenario.ended() < ended_on_master, "no end was lost: the replica did not lag"
            for worker in workers:
                worker.resume()
            await scenario.check(ids, timeout=90, dead_letters=0)
            assert all(w.alive for w in workers), "a worker died in the failover"
            assert scenario.reruns(), "nothing was re-driven: the failover tested nothing"
    finally:
        for server in (promoted, replica, master):
            server.kill()


async def test_with_replica_acks_no_acknowledged_start_is_lost_in_a_failover(tmp_path: Path) -> None:
    """The WAIT option (docs/operations.md): a start returns only once a replica holds it, so a failover
    loses only starts whose caller got :class:`bus.ReplicaAckTimeout` (and may retry)."""
    master, replica = await synced_pair(tmp_path)
    promoted = replica
    redis = bus.connect(master.url)
    waiting = EngineConfig(bus=BusConfig(replica_acks=1, replica_ack_timeout_ms=200))
    client = SagaClient(redis, REGISTRY, config=waiting)
    unwaiting = SagaClient(redis, REGISTRY)
    try:
        acknowledged = [
            await client.start(order, Order(id=f"acked-{n}"), saga_id=f"acked-{n}") for n in range(20)
        ]
        replica.pause()
        for n in range(3):
            with pytest.raises(bus.ReplicaAckTimeout) as late:
                await client.start(order, Order(id=f"late-{n}"), saga_id=f"late-{n}")
            assert (late.value.acked, late.value.wanted, late.value.retryable) == (0, 1, True)
        await unwaiting.start(
            order, Order(id="unwaited"), saga_id="unwaited"
        )  # acknowledged by the master alone
        master.kill()
        replica.kill()
        promoted = replica.promoted(master.port)
        await promoted.start()
        for saga_id in acknowledged:
            assert (await client.get(saga_id)).id == saga_id
        with pytest.raises(SagaNotFound):  # what the option protects against
            await unwaiting.get("unwaited")
        with pytest.raises(bus.ReplicaAckTimeout):  # the promoted master has no replica (yet)
            await client.start(order, Order(id="late-0"), saga_id="late-0")
    finally:
        await redis.aclose()
        for server in (promoted, replica, master):
            server.kill()
