"""Servers owned by one test: a private ``redis-server`` and a private PostgreSQL cluster.

Each lives in a temporary directory on a free loopback port. A test stops, kills, pauses
and restarts only what it started, and ``start`` checks that the server answering on the
port is the process it just spawned (its ``process_id``), never a stray one. ``initdb``
refuses to run as root, so as root the PostgreSQL cluster runs as the ``postgres`` user.

The fixtures here are registered for the whole suite by ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio
import pytest

import bus
from tests.conftest import IN_CI

Fsync = Literal["always", "everysec", "no"]


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def require_binary(name: str, *candidates: Path) -> Path:
    """The path of ``name``; fail in CI, skip elsewhere, when it is not installed."""
    found = shutil.which(name)
    if found:
        return Path(found)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    reason = f"{name} is not installed"
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


@dataclass
class PrivateRedis:
    """A ``redis-server`` owned by one test.

    ``appendfsync=None`` runs without any persistence (a restart comes back empty);
    otherwise AOF is on with that fsync policy and a restart on the same directory
    reloads it. ``options`` are extra ``redis-server`` arguments.
    """

    directory: Path
    appendfsync: Fsync | None = None
    options: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL of database 0 on this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        """The server's process id (it must be running)."""
        assert self.process is not None
        return self.process.pid

    def _command(self) -> list[str]:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", self.appendfsync]
            if self.appendfsync
            else ["--appendonly", "no"]
        )
        return [
            str(require_binary("redis-server")),
            "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
            "--save", "", *persistence, *self.options,
        ]  # fmt: skip

    async def start(self) -> None:
        """Start on this directory and port; return once this very process answers."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL)
        client = bus.connect(self.url)
        try:
            with anyio.fail_after(15):
                while True:
                    if self.process.poll() is not None:
                        raise RuntimeError(f"redis-server on port {self.port} exited at start")
                    with contextlib.suppress(Exception):
                        info = await client.info("server")
                        if int(info["process_id"]) != self.process.pid:
                            raise RuntimeError(f"port {self.port} is answered by another redis-server")
                        if not int((await client.info("persistence")).get("loading", 0)):
                            return
                    await anyio.sleep(0.02)
        finally:
            await client.aclose()

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save; only what AOF already holds survives."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the server stops answering but keeps its sockets open."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    async def restart(self) -> None:
        """Kill and start again on the same directory and port."""
        self.kill()
        await self.start()

    def replica(self, directory: Path, appendfsync: Fsync = "always") -> PrivateRedis:
        """A server (not started) that replicates this one, with its own AOF."""
        options = (*self.options, "--replicaof", "127.0.0.1", str(self.port))
        return PrivateRedis(directory, appendfsync=appendfsync, options=options)

    async def wait_synced(self) -> None:
        """Poll until this replica's link is up and its AOF holds the initial sync.

        After a sync the replica rewrites its AOF; killed before that rewrite ends, it
        comes back without what it was sent.
        """
        client = bus.connect(self.url)
        try:
            with anyio.fail_after(15):
                while (await client.info("replication")).get("master_link_status") != "up":
                    await anyio.sleep(0.02)
            await _aof_rewritten(client)
        finally:
            await client.aclose()

    async def rewrite_aof(self) -> None:
        """``BGREWRITEAOF`` and wait for it: what was written so far is in an fsynced base
        file (so a later kill or a cut tail cannot take it)."""
        client = bus.connect(self.url)
        try:
            await client.bgrewriteaof()
            await _aof_rewritten(client)
        finally:
            await client.aclose()

    def promoted(self, port: int) -> PrivateRedis:
        """This replica's data as a master (not started) on ``port``: a failover onto it.

        Start it after killing this server: what the replica had not read from its link
        when it died is lost, as on a replica that lagged. Taking the old master's port
        stands in for a Sentinel or DNS switch: clients reconnect to the URL they know.
        """
        options = list(self.options)
        at = options.index("--replicaof")
        del options[at : at + 3]
        return PrivateRedis(self.directory, appendfsync=self.appendfsync, options=tuple(options), port=port)

    def aof_files(self) -> list[Path]:
        """The AOF files the server appends to (Redis 7 keeps them in ``appendonlydir``)."""
        return sorted((self.directory / "appendonlydir").glob("*.incr.aof"))

    def truncate_aof_tail(self, nbytes: int) -> int:
        """Cut ``nbytes`` off the newest AOF file (a power loss); return the bytes cut.

        The server must be stopped. A cut mid-command needs ``aof-load-truncated yes``
        (Redis's default), which drops the partial command at load.
        """
        newest = self.aof_files()[-1]
        size = newest.stat().st_size
        cut = min(nbytes, size)
        with newest.open("r+b") as aof:
            aof.truncate(size - cut)
        return cut


async def _aof_rewritten(client: bus.Redis) -> None:
    """Poll until no AOF rewrite runs or is scheduled on ``client``'s server."""
    with anyio.fail_after(20):
        while True:
            persistence = await client.info("persistence")
            if not int(persistence["aof_rewrite_in_progress"]) + int(persistence["aof_rewrite_scheduled"]):
                return
            await anyio.sleep(0.02)


@pytest.fixture
async def private_redis_server(tmp_path: Path) -> AsyncIterator[PrivateRedis]:
    """A running private ``redis-server`` without persistence, killed after the test."""
    server = PrivateRedis(tmp_path / "redis", options=("--maxmemory-policy", "noeviction"))
    await server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def private_redis_url(private_redis_server: PrivateRedis) -> str:
    """The URL of :func:`private_redis_server`."""
    return private_redis_server.url


@pytest.fixture
async def private_redis(private_redis_server: PrivateRedis) -> AsyncIterator[bus.Redis]:
    """A client of :func:`private_redis_server`."""
    client = bus.connect(private_redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def aof_redis(tmp_path: Path) -> AsyncIterator[PrivateRedis]:
    """A running private ``redis-server`` with AOF ``appendfsync always``."""
    server = PrivateRedis(tmp_path / "redis-aof", appendfsync="always")
    await server.start()
    try:
        yield server
    finally:
        server.kill()


def _pg_bin() -> Path:
    initdb = require_binary("initdb", *sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True))
    return initdb.parent


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster owned by one test (``fsync=off``: a crash test, not a durability one)."""

    bin: Path
    root: Path
    port: int
    user: str | None

    @property
    def dsn(self) -> str:
        """The DSN of the cluster's ``postgres`` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(
            [str(self.bin / args[0]), *args[1:]], check=True, user=self.user, capture_output=True, timeout=60
        )

    def init(self) -> None:
        """Create the cluster's data directory."""
        data = str(self.root / "data")
        self._run("initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        """Start the cluster and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        data, log = str(self.root / "data"), str(self.root / "log")
        self._run("pg_ctl", "-D", data, "-o", options, "-l", log, "-w", "start")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the cluster; ``immediate`` is a crash (no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", mode, "-w", "stop")


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL cluster, removed after the test."""
    pg_bin = _pg_bin()
    user = None
    root = Path(tempfile.mkdtemp(prefix="redsaga-pg-"))
    if os.geteuid() == 0:
        user = "postgres"
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    cluster = PrivatePostgres(pg_bin, root, free_port(), user)
    cluster.init()
    cluster.start()
    try:
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped by the test
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
