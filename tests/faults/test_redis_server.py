"""Redis server faults (catalogue items 6, 7): the server dies under saga load and comes back.

Every test runs its own ``redis-server`` (``tests/faults/servers.py``) under a scenario of
``tests/faults/app.py`` workers (``tests/faults/scenario.py``, effects in PostgreSQL, which
a Redis fault cannot take back), then asserts G1-G8 with the checker, including that the
effects in PostgreSQL are exactly those each saga's end implies.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.scenario import open_scenario
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis, pytest.mark.postgres]
SAGAS = 200


async def test_sigkill_redis_with_aof_everysec_under_load_loses_no_saga(tmp_path: Path, pg_dsn: str) -> None:
    """Catalogue item 6: SIGKILL redis-server mid-flight, restart on its directory: the workers
    reconnect (back-off with jitter), reload their scripts (the cache is empty) and end
    every saga; each effect once."""
    server = PrivateRedis(
        tmp_path / "redis", appendfsync="everysec", options=("--maxmemory-policy", "noeviction")
    )
    await server.start()
    try:
        async with open_scenario(server.url, pg_dsn, tmp_path / "logs") as scenario:
            ids = await scenario.start(scenario.mixed(SAGAS))
            await (
                server.rewrite_aof()
            )  # the starts were acknowledged: make them survive everysec's last second
            workers = [await scenario.worker("w1"), await scenario.worker("w2")]
            await scenario.wait_ended(SAGAS // 5)
            server.kill()
            await server.start()
            assert await scenario.ended() < SAGAS, "the kill came too late to test anything"
            await scenario.check(ids, timeout=60, dead_letters=0)
            assert all(w.alive for w in workers), "a worker died instead of reconnecting"
    finally:
        server.kill()


async def test_lost_aof_tail_is_redriven_and_applied_once(tmp_path: Path, pg_dsn: str) -> None:
    """Catalogue item 7: a power loss cuts the AOF's tail. Transitions, replies and acks that the
    participants already acted on vanish; the sagas are re-driven from what survived, with
    the same saga ids and idempotency keys, so the participants' dedupe keeps one effect."""
    server = PrivateRedis(tmp_path / "redis", appendfsync="always", options=("--aof-load-truncated", "yes"))
    await server.start()
    try:
        async with open_scenario(server.url, pg_dsn, tmp_path / "logs") as scenario:
            ids = await scenario.start(scenario.mixed(SAGAS))
            await server.rewrite_aof()  # the starts are in the base file; only progress is cut
            await scenario.worker("w1")
            await scenario.worker("w2")
            await scenario.wait_ended(SAGAS // 3)
            server.kill()
            server.truncate_aof_tail(server.aof_files()[-1].stat().st_size // 2)
            await server.start()
            assert await scenario.ended() < SAGAS
            await scenario.check(ids, timeout=60, dead_letters=0)
            # the cut made participants run again for work that had taken effect: the
            # dedupe was needed, and it kept one effect per key (G2 above)
            assert scenario.reruns(), "nothing was re-driven: the cut tested nothing"
    finally:
        server.kill()
