"""Shared fixtures: Redis (embedded and real), PostgreSQL, and the CI rule for missing servers.

Tests that need a real server fail in CI (``CI=true``) when it does not answer and skip
elsewhere with the reason. Each run uses its own Redis database (``REDSAGA_TEST_REDIS_DB``,
default 9), flushed before every test, and the PostgreSQL DSN in ``REDSAGA_TEST_PG_DSN``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

import bus

REDIS_HOST = os.environ.get("REDSAGA_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("REDSAGA_TEST_REDIS_PORT", "6379"))
REDIS_DB = int(os.environ.get("REDSAGA_TEST_REDIS_DB", "9"))
REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{REDIS_DB}"
PG_DSN = os.environ.get("REDSAGA_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

pytest_plugins = ["tests.faults.servers"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-minutes",
        type=float,
        default=0.5,
        help="how long the fault soak (tests/faults/test_soak.py, marker soak) runs its load",
    )


@pytest.fixture
def soak_minutes(request: pytest.FixtureRequest) -> float:
    """The soak's load duration (``--soak-minutes``)."""
    return float(request.config.getoption("--soak-minutes"))


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def require_server(name: str, host: str, port: int) -> None:
    """Fail (in CI) or skip (elsewhere) when a server the test needs does not answer."""
    if _answers(host, port):
        return
    reason = f"{name} is not answering on {host}:{port}"
    if IN_CI:
        pytest.fail(f"{reason} (CI must start it: see .ci/run)")
    pytest.skip(f"{reason}; start it to run this test")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def real_redis_url() -> str:
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    return REDIS_URL


@pytest.fixture
async def real_redis(real_redis_url: str) -> AsyncIterator[bus.Redis]:
    client = bus.connect(real_redis_url)
    await client.flushdb()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def fake_redis() -> AsyncIterator[bus.Redis]:
    client = bus.connect(bus.MEMORY_URL)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(params=["fake", "real"])
async def redis(request: pytest.FixtureRequest) -> AsyncIterator[bus.Redis]:
    """The contract-suite fixture: every test using it runs on fakeredis and on real Redis."""
    if request.param == "fake":
        client = bus.connect(bus.MEMORY_URL)
    else:
        require_server("Redis", REDIS_HOST, REDIS_PORT)
        client = bus.connect(REDIS_URL)
        await client.flushdb()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def backend(redis: bus.Redis) -> str:
    """``fake`` or ``real``: lets a contract test state an honest difference explicitly."""
    return "fake" if bus.is_embedded(redis) else "real"


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    from urllib.parse import urlparse

    parsed = urlparse(PG_DSN)
    require_server("PostgreSQL", parsed.hostname or "127.0.0.1", parsed.port or 5432)
    yield PG_DSN


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """CLI commands configure structlog for the process; undo it so no test logs into
    another test's captured (and by then closed) stream."""
    import structlog

    yield
    structlog.reset_defaults()
