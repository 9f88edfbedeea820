"""Real processes for fault tests: the relay as ``saga relay``, and a private PostgreSQL cluster.

The private cluster lives in a temporary directory on a free loopback port; tests stop and
restart only it, never a server they did not start. ``initdb`` refuses to run as root, so
as root the cluster runs as the ``postgres`` user.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import bus
from tests.conftest import IN_CI
from tests.relay.helpers import wait_for

SAGA = str(Path(sys.executable).parent / "saga")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class RelayProcess:
    """``saga relay`` running in a child process."""

    args: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] = field(init=False)
    output: bytes = b""

    def __post_init__(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [SAGA, "relay", "--json", *self.args], env=self.env, stdout=subprocess.PIPE, stderr=log
            )

    def wait(self, timeout: float = 60) -> int:
        """Wait for the exit; keep what it printed; return the exit code (-9 after SIGKILL)."""
        out, _ = self.process.communicate(timeout=timeout)
        self.output += out or b""
        return self.process.returncode

    def counters(self) -> dict[str, Any]:
        """The JSON counters the relay printed when it exited."""
        return dict(json.loads(self.output))

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.wait(10)


def start_relay(
    dsn: str, redis_url: str, log: Path, *extra: str, crash_at: str | None = None, tables: str | None = None
) -> RelayProcess:
    env = {k: v for k, v in os.environ.items() if k != "REDSAGA_CRASH_AT"}
    if crash_at:
        env["REDSAGA_CRASH_AT"] = crash_at
    args = ["--dsn", dsn, "--redis-url", redis_url, *(["--tables", tables] if tables else []), *extra]
    return RelayProcess(args, env, log)


def _pg_bin() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return Path(candidates[-1]).parent if candidates else None


@dataclass
class PrivateCluster:
    """A PostgreSQL cluster owned by one test."""

    bin: Path
    root: Path
    port: int
    user: str | None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(
            [str(self.bin / args[0]), *args[1:]], check=True, user=self.user, capture_output=True, timeout=60
        )

    def init(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.root / "data"),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            "pg_ctl",
            "-D",
            str(self.root / "data"),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )

    def stop(self, mode: str = "immediate") -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", mode, "-w", "stop")


@pytest.fixture
def private_pg() -> Any:
    pg_bin = _pg_bin()
    if pg_bin is None:
        reason = "PostgreSQL server binaries (initdb, pg_ctl) are not installed"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    user = None
    root = Path(tempfile.mkdtemp(prefix="redsaga-pg-"))
    if os.geteuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    cluster = PrivateCluster(pg_bin, root, free_port(), user)
    cluster.init()
    cluster.start()
    try:
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped by the test
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def private_redis_server(tmp_path: Path) -> AsyncIterator[str]:
    """A redis-server of this test's own, so it may change maxmemory."""
    server = shutil.which("redis-server")
    if server is None:
        if IN_CI:
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = free_port()
    process = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
            "--maxmemory-policy",
            "noeviction",
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = bus.connect(url)
    try:
        await wait_for(lambda: _answers(client), timeout_s=10)
        yield url
    finally:
        await client.aclose()
        process.kill()
        process.wait(10)


@pytest.fixture
def private_redis_url(private_redis_server: str) -> str:
    return private_redis_server


@pytest.fixture
async def private_redis(private_redis_server: str) -> AsyncIterator[bus.Redis]:
    client = bus.connect(private_redis_server)
    try:
        yield client
    finally:
        await client.aclose()


async def _answers(client: bus.Redis) -> bool:
    try:
        return bool(await client.ping())
    except bus.BusError:
        return False
    except Exception:
        return False


def sigterm(process: RelayProcess) -> None:
    process.signal(signal.SIGTERM)
