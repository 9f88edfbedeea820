"""Catalogue item 13: Redis settings that lose saga data are refused or reported at start.

``bus/_safety.py``: an eviction policy is refused by default, AOF off is logged as an
error; both are configurable, and a Redis that will not show its settings is reported.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

import bus
from bus import BusConfig, Worker
from tests.faults.servers import PrivateRedis
from tests.faults.test_redis_epoch import jobs_app

pytestmark = [pytest.mark.anyio, pytest.mark.faults, pytest.mark.redis]


@pytest.fixture
async def evicting_redis(tmp_path: Path) -> AsyncIterator[bus.Redis]:
    server = PrivateRedis(
        tmp_path / "redis", appendfsync="everysec", options=("--maxmemory-policy", "allkeys-lru")
    )
    await server.start()
    client = bus.connect(server.url)
    try:
        yield client
    finally:
        await client.aclose()
        server.kill()


async def test_an_eviction_policy_is_refused_before_anything_is_written(evicting_redis: bus.Redis) -> None:
    with anyio.fail_after(20), pytest.raises(bus.UnsafeRedisConfig, match="allkeys-lru") as raised:
        await Worker(evicting_redis, jobs_app()).run()
    assert len(raised.value.problems) == 1
    assert not raised.value.retryable
    assert await evicting_redis.dbsize() == 0  # not even the epoch


@pytest.mark.parametrize(("mode", "logged"), [("warn", True), ("ignore", False)])
async def test_an_eviction_policy_can_be_allowed(evicting_redis: bus.Redis, mode: str, logged: bool) -> None:
    worker = Worker(evicting_redis, jobs_app(), config=BusConfig(on_eviction=mode))  # type: ignore[arg-type]
    with capture_logs() as logs:
        await worker.preflight()
    unsafe = [log for log in logs if log["event"] == "unsafe Redis configuration"]
    assert bool(unsafe) == logged
    assert all(log["log_level"] == "error" and "allkeys-lru" in log["problem"] for log in unsafe)
    assert worker.epoch is not None


async def test_no_aof_is_logged_as_an_error_by_default_and_may_be_refused(private_redis: bus.Redis) -> None:
    with capture_logs() as logs:
        await Worker(private_redis, jobs_app()).preflight()
    assert [log["problem"][:20] for log in logs if log["event"] == "unsafe Redis configuration"] == [
        "appendonly is no: a "
    ]
    with pytest.raises(bus.UnsafeRedisConfig, match="appendonly is no"):
        await Worker(private_redis, jobs_app(), config=BusConfig(on_no_aof="refuse")).preflight()


async def test_a_redis_that_hides_its_settings_is_reported_and_used(
    private_redis: bus.Redis, private_redis_url: str
) -> None:
    # a user with every command but INFO (a managed service may rename it away)
    await private_redis.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-info")
    limited = bus.connect(private_redis_url.replace("redis://", "redis://app:pw@"))
    try:
        worker = Worker(limited, jobs_app(), config=BusConfig(on_no_aof="refuse"))
        with capture_logs() as logs:
            await worker.preflight()
        assert any(
            log["log_level"] == "warning" and log["event"].startswith("could not check the Redis settings")
            for log in logs
        )
        assert worker.epoch is not None
    finally:
        await limited.aclose()


def test_an_unknown_mode_is_refused_by_the_config() -> None:
    with pytest.raises(ValueError, match="on_eviction"):
        BusConfig(on_eviction="maybe")  # type: ignore[arg-type]
