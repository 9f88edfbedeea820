"""Shared fixtures: Redis (embedded and real), PostgreSQL, and the CI rule for missing servers.

The suite never touches a server it did not start or was not given for its own use:

- **Redis**: each test session starts a private ``redis-server`` (no persistence) on a free
  loopback port in a temporary directory, and kills it at the end. Set
  ``REDSAGA_TEST_REDIS_URL`` to use a server dedicated to the tests instead (it is flushed
  before every test that uses it).
- **PostgreSQL**: each session creates its own database (``redsaga_test_<random>``) on the
  server of ``REDSAGA_TEST_PG_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``)
  and drops it at the end.

Tests that need a server fail in CI (``CI=true``) when it is missing and skip elsewhere with
the reason; so do the browser tests (marker ``browser``) without Debian's ``/usr/bin/chromium``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import pytest

import bus
from bus.lowlevel import VERIFY_ENV, is_cluster, is_embedded

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# Workers and clients refuse to run without a keyring unless signing is turned off on purpose.
# Most tests exercise the engine, not signing: they run with it off, said once here (processes
# the tests start inherit it). The tests of signing give keyrings, or clear this to see the refusal.
os.environ.setdefault(VERIFY_ENV, "off")
_GIVEN_REDIS_URL = os.environ.get("REDSAGA_TEST_REDIS_URL", "")
_PG_SERVER_DSN = os.environ.get("REDSAGA_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")

REDIS_URL = _GIVEN_REDIS_URL
"""The real Redis of this session (set by :func:`pytest_configure`; empty: none)."""
PG_DSN = _PG_SERVER_DSN
"""The PostgreSQL database of this session (set by :func:`pytest_configure`)."""
_started: list[subprocess.Popen[bytes]] = []
_created_databases: list[str] = []
_temp_dirs: list[Path] = []


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGKILL it when the test process dies."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


PR_SET_PDEATHSIG = 1


def _start_private_redis() -> str:
    """Start this session's ``redis-server``; its URL (empty when it is not installed)."""
    binary = shutil.which("redis-server")
    if binary is None:
        return ""
    directory = Path(tempfile.mkdtemp(prefix="redsaga-test-redis-"))
    _temp_dirs.append(directory)
    port = _free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
         "--appendonly", "no", "--maxmemory-policy", "noeviction", "--logfile", str(directory / "log")],
        stdout=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - at configure time, before any thread; an xdist worker can exit before unconfigure
    )  # fmt: skip
    _started.append(process)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # poll until this very process answers PING
        if process.poll() is not None:
            raise RuntimeError(f"the test session's redis-server exited at start (see {directory / 'log'})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            if conn.recv(16).startswith(b"+PONG"):
                return f"redis://127.0.0.1:{port}/0"
        time.sleep(0.02)  # a start-up poll of a server, not a test waiting for time to pass
    raise RuntimeError("the test session's redis-server did not answer within 15 s")


def _create_pg_database() -> str:
    """Create this session's PostgreSQL database; its DSN (the server's when it is not up)."""
    import psycopg

    try:
        with psycopg.connect(_PG_SERVER_DSN, autocommit=True, connect_timeout=3) as conn:
            name = f"redsaga_test_{secrets.token_hex(4)}"
            conn.execute(f"CREATE DATABASE {name}")
    except psycopg.OperationalError:
        return _PG_SERVER_DSN
    _created_databases.append(name)
    return urlunparse(urlparse(_PG_SERVER_DSN)._replace(path=f"/{name}"))


REPORTED_VERSIONS = ("redis", "hiredis", "msgspec", "anyio", "fakeredis", "typer", "structlog", "psycopg")
"""The runtime dependencies whose resolved versions head every run (CI runs the newest and the lowest)."""


def pytest_report_header() -> str:
    """The versions of the runtime dependencies this run resolved."""
    from importlib.metadata import version

    return "runtime dependencies: " + ", ".join(f"{name} {version(name)}" for name in REPORTED_VERSIONS)


def pytest_configure(config: pytest.Config) -> None:
    """Start this session's servers before any test module is imported."""
    global REDIS_URL, PG_DSN  # noqa: PLW0603 - set once, before collection imports them
    if (
        not hasattr(config, "workerinput")
        and config.pluginmanager.hasplugin("xdist")
        and (config.getoption("numprocesses", None))
    ):
        return  # the xdist controller runs no test; each worker starts its own servers
    if not REDIS_URL:
        REDIS_URL = _start_private_redis()
    PG_DSN = _create_pg_database()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop and drop only what this session started."""
    for process in _started:
        process.kill()
        process.wait(10)
    if _created_databases:
        import psycopg

        with (
            contextlib.suppress(psycopg.OperationalError),
            psycopg.connect(_PG_SERVER_DSN, autocommit=True, connect_timeout=3) as conn,
        ):
            for name in _created_databases:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    for directory in _temp_dirs:
        shutil.rmtree(directory, ignore_errors=True)
    from tests.cluster import stop_shared

    stop_shared()


pytest_plugins = ["tests.faults.servers", "tests.cluster"]


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


def require_server(name: str, url: str) -> None:
    """Fail (in CI) or skip (elsewhere) when a server the test needs does not answer."""
    parsed = urlparse(url)
    if url and _answers(parsed.hostname or "127.0.0.1", parsed.port or 0):
        return
    reason = f"{name} is not answering on {parsed.netloc}" if url else f"no {name} for the tests"
    if IN_CI:
        pytest.fail(f"{reason} (CI must install it: see .ci/run)")
    pytest.skip(f"{reason}; install redis-server and PostgreSQL to run this test")


CHROMIUM = Path("/usr/bin/chromium")
"""Debian's chromium, which the browser tests drive (``.ci/run`` installs it)."""


def require_browser() -> None:
    """Fail (in CI) or skip (elsewhere) when Debian's chromium is not installed."""
    if CHROMIUM.exists():
        return
    if IN_CI:
        pytest.fail(f"no Chromium at {CHROMIUM} (CI must install it: see .ci/run)")
    pytest.skip(f"no Chromium at {CHROMIUM}; apt-get install chromium to run this test")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def real_redis_url() -> str:
    require_server("Redis", REDIS_URL)
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


@pytest.fixture(params=["fake", "real", pytest.param("cluster", marks=pytest.mark.cluster)])
async def redis(request: pytest.FixtureRequest) -> AsyncIterator[bus.Redis]:
    """The contract-suite fixture: every test using it runs on fakeredis and on real Redis.

    A module marked ``on_cluster`` runs them on the test cluster as well (tests/cluster.py).
    """
    if request.param == "fake":
        client = bus.connect(bus.MEMORY_URL)
    elif request.param == "cluster":
        from tests.cluster import flush, shared_cluster

        client = bus.connect(shared_cluster().url)
        await flush(client)
    else:
        require_server("Redis", REDIS_URL)
        client = bus.connect(REDIS_URL)
        await client.flushdb()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def backend(redis: bus.Redis) -> str:
    """``fake``, ``real`` or ``cluster``: lets a contract test state an honest difference explicitly."""
    if is_embedded(redis):
        return "fake"
    return "cluster" if is_cluster(redis) else "real"


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    require_server("PostgreSQL", PG_DSN)
    yield PG_DSN


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """CLI commands configure structlog for the process; undo it so no test logs into
    another test's captured (and by then closed) stream."""
    import structlog

    yield
    structlog.reset_defaults()
