"""Fixtures of the saga fault scenarios."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import bus
from tests.cluster import flush, shared_cluster
from tests.faults.scenario import Scenario, open_scenario


@pytest.fixture(params=["real", pytest.param("cluster", marks=pytest.mark.cluster)])
async def scenario(request: pytest.FixtureRequest, pg_dsn: str, tmp_path: Path) -> AsyncIterator[Scenario]:
    """A saga fault scenario on the test's Redis database (flushed) and PostgreSQL.

    In a module marked ``on_cluster`` also on the session's Redis Cluster (emptied first).
    """
    on_cluster = request.param == "cluster"
    # real_redis_url skips (fails in CI) when there is no Redis
    url = shared_cluster().url if on_cluster else request.getfixturevalue("real_redis_url")
    client = bus.connect(url)
    await (flush(client) if on_cluster else client.flushdb())
    await client.aclose()
    async with open_scenario(url, pg_dsn, tmp_path / "logs") as opened:
        yield opened
