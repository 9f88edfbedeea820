"""FAULTS 20: failover to a replica that lagged behind the master.

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
from tests.faults.server_load import SagaLoad, effects_tables
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis, pytest.mark.postgres]
__all__ = ["effects_tables"]  # the fixture, imported to be found by pytest


async def test_failover_to_a_lagging_replica_redrives_lost_transitions_once(
    tmp_path: Path, pg_dsn: str, effects_tables: str
) -> None:
    master = PrivateRedis(tmp_path / "master", appendfsync="everysec")
    replica = master.replica(tmp_path / "replica")
    await master.start()
    await replica.start()
    await replica.wait_synced()
    promoted = replica
    redis = bus.connect(master.url)
    load = SagaLoad(master, pg_dsn, effects_tables, tmp_path / "workers.log")
    try:
        await load.start(redis)
        assert await redis.execute_command("WAIT", 1, 10_000) == 1  # the starts reached the replica
        load.spawn()
        load.spawn()
        await load.wait_ended(redis, load.sagas // 5, within_s=30)
        replica.pause()  # the replica lags from here on
        lagging_from = await load.ended(redis)
        await load.wait_ended(redis, lagging_from + load.sagas // 5, within_s=30)
        master.kill()
        replica.kill()
        promoted = replica.promoted(master.port)
        await promoted.start()
        lost_ends = lagging_from - await load.ended(redis)
        await load.wait_ended(redis, load.sagas, within_s=90)
        assert all(w.poll() is None for w in load.workers), "a worker died in the failover"
    finally:
        load.stop_workers()
    try:
        await load.check(redis)
        assert lost_ends > 0, "no end was lost: the replica did not lag"
        assert load.runs() > len(load.effects()), "nothing was re-driven: the failover tested nothing"
    finally:
        await redis.aclose()
        for server in (promoted, replica, master):
            server.kill()
