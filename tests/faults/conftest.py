"""Fixtures of the saga fault scenarios."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import bus
from tests.faults.scenario import Scenario, open_scenario


@pytest.fixture
async def scenario(
    real_redis: bus.Redis, real_redis_url: str, pg_dsn: str, tmp_path: Path
) -> AsyncIterator[Scenario]:
    """A saga fault scenario on the test's Redis database (flushed) and PostgreSQL."""
    async with open_scenario(real_redis_url, pg_dsn, tmp_path / "logs") as opened:
        yield opened
