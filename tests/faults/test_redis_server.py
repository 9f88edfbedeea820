"""Redis server faults (FAULTS.md 6, 7): the server dies under saga load and comes back.

Every test runs its own ``redis-server`` (``tests/faults/servers.py``) and real worker
processes (``tests/faults/server_app.py``, effects in PostgreSQL), then checks G1-G4 with
:meth:`SagaLoad.check`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import bus
from tests.faults.server_load import SagaLoad, effects_tables, rewrite_aof
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis, pytest.mark.postgres]
__all__ = ["effects_tables"]  # the fixture, imported to be found by pytest


async def test_sigkill_redis_with_aof_everysec_under_load_loses_no_saga(
    tmp_path: Path, pg_dsn: str, effects_tables: str
) -> None:
    """FAULTS 6: SIGKILL redis-server mid-flight, restart on its directory: the workers
    reconnect (back-off with jitter), reload their scripts (the cache is empty) and end
    every saga; each effect once."""
    server = PrivateRedis(
        tmp_path / "redis", appendfsync="everysec", options=("--maxmemory-policy", "noeviction")
    )
    await server.start()
    redis = bus.connect(server.url)
    load = SagaLoad(server, pg_dsn, effects_tables, tmp_path / "workers.log")
    try:
        await load.start(redis)
        await rewrite_aof(redis)  # the starts were acknowledged: make them survive everysec's last second
        load.spawn()
        load.spawn()
        await load.wait_ended(redis, load.sagas // 5, within_s=30)
        server.kill()
        await server.start()
        assert await load.ended(redis) < load.sagas, "the kill came too late to test anything"
        await load.wait_ended(redis, load.sagas, within_s=60)
        assert all(w.poll() is None for w in load.workers), "a worker died instead of reconnecting"
    finally:
        load.stop_workers()
        server.kill()
    await server.start()
    try:
        await load.check(redis)
    finally:
        await redis.aclose()
        server.kill()


async def test_lost_aof_tail_is_redriven_and_applied_once(
    tmp_path: Path, pg_dsn: str, effects_tables: str
) -> None:
    """FAULTS 7: a power loss cuts the AOF's tail. Transitions, replies and acks that the
    participants already acted on vanish; the sagas are re-driven from what survived, with
    the same saga ids and idempotency keys, so the participants' dedupe keeps one effect."""
    server = PrivateRedis(tmp_path / "redis", appendfsync="always", options=("--aof-load-truncated", "yes"))
    await server.start()
    redis = bus.connect(server.url)
    load = SagaLoad(server, pg_dsn, effects_tables, tmp_path / "workers.log")
    try:
        await load.start(redis)
        await rewrite_aof(redis)  # the starts are in the base file; only progress is cut
        load.spawn()
        load.spawn()
        await load.wait_ended(redis, load.sagas // 3, within_s=30)
        server.kill()
        tail = server.aof_files()[-1].stat().st_size
        server.truncate_aof_tail(tail // 2)
        await server.start()
        forgotten_runs = load.runs()
        assert await load.ended(redis) < load.sagas
        await load.wait_ended(redis, load.sagas, within_s=60)
    finally:
        load.stop_workers()
    try:
        await load.check(redis)
        # the cut made participants run again for work they had done (the dedupe was needed)
        assert load.runs() > len(load.effects()), "nothing was re-driven: the cut tested nothing"
        assert forgotten_runs
    finally:
        await redis.aclose()
        server.kill()
