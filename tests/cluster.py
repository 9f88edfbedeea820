"""A real Redis Cluster for the tests: 6 nodes (3 masters, 3 replicas) on loopback ports.

Each node is a ``redis-server --cluster-enabled yes`` without persistence in its own
temporary directory; ``redis-cli --cluster create … --cluster-replicas 1`` joins them. The
cluster is started at most once per test process (xdist worker), on the first test that
asks for it (fixture ``cluster``, marker ``cluster``), and killed when the session ends.
fakeredis has no cluster, so only this shows that every path routes by slot.

A failover test may kill or fail over nodes: it asks for ``fresh_cluster`` (a cluster of
its own, stopped after the test) so that the shared one keeps its shape.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis as redis_sync
from redis.asyncio.cluster import RedisCluster

import bus
from tests.conftest import IN_CI, _die_with_parent, _free_port

MASTERS = 3
"""Masters of the test cluster; each has one replica."""
NODE_TIMEOUT_MS = 1000
"""``cluster-node-timeout``: how long a master may be unreachable before its replica takes over."""


def _node_port(taken: Collection[int] = ()) -> int:
    """A free port whose cluster-bus port (port + 10000) is valid and free too.

    Neither may be a port or bus port of the nodes ``taken`` before it: both are free until
    the nodes start, so a port picked later could be an earlier node's bus port.
    """
    used = {*taken, *(port + 10000 for port in taken)}
    while True:
        port = _free_port()
        if port + 10000 < 65536 and not {port, port + 10000} & used and _is_free(port + 10000):
            return port


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _reply(port: int, *command: str) -> str:
    """One command's reply as text, over a raw socket (no client library involved)."""
    parts = "".join(f"${len(arg)}\r\n{arg}\r\n" for arg in command)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(f"*{len(command)}\r\n{parts}".encode())
        data = b""
        conn.settimeout(2)
        while True:
            chunk = conn.recv(65536)
            data += chunk
            if not chunk or _complete(data):
                return data.decode(errors="replace")


def _complete(data: bytes) -> bool:
    if data[:1] in (b"+", b"-", b":"):
        return data.endswith(b"\r\n")
    if data[:1] == b"$":
        header, _, rest = data.partition(b"\r\n")
        return int(header[1:]) < 0 or len(rest) >= int(header[1:]) + 2
    return True


def _info(port: int, section: str) -> dict[str, str]:
    text = _reply(port, "CLUSTER", "INFO") if section == "cluster" else _reply(port, "INFO", section)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("$"))


@dataclass
class LocalCluster:
    """A 6-node Redis Cluster on loopback owned by this test process."""

    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="redsaga-cluster-")))
    ports: list[int] = field(default_factory=list)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every node that is still running."""
        alive = [port for port in self.ports if self.processes[port].poll() is None]
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in alive)

    def start(self) -> LocalCluster:
        """Start the nodes, create the cluster and wait until every node says ``cluster_state:ok``."""
        server = shutil.which("redis-server")
        cli = shutil.which("redis-cli")
        if server is None or cli is None:
            reason = "redis-server and redis-cli are needed for the cluster tests"
            if IN_CI:
                pytest.fail(reason)
            pytest.skip(reason)
        try:
            self.ports = []
            for _ in range(2 * MASTERS):
                self.ports.append(_node_port(self.ports))
            for port in self.ports:
                self._spawn(server, port)
            for port in self.ports:
                self._wait(lambda port=port: _reply(port, "PING").startswith("+PONG"), f"node {port} answers")
            subprocess.run(
                [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", "1", "--cluster-yes"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60,
            )  # fmt: skip
            self.wait_ok()
            self.wait_synced()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, server: str, port: int) -> None:
        node_dir = self.directory / str(port)
        node_dir.mkdir(exist_ok=True)
        self.processes[port] = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir),
             "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--save", "", "--appendonly", "no",
             "--maxmemory-policy", "noeviction", "--logfile", str(node_dir / "log")],
            stdout=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - killed with the test process, as the single server is
        )  # fmt: skip

    def _wait(self, check: object, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if check():  # type: ignore[operator]
                    return
            time.sleep(0.05)  # polling a server's start-up, not a test waiting for time to pass
        raise RuntimeError(f"the test cluster: timed out waiting until {what} (logs in {self.directory})")

    def wait_ok(self, timeout: float = 30) -> None:
        """Wait until every running node reports ``cluster_state:ok`` with all slots served."""

        def ok() -> bool:
            for port in self.running():
                info = _info(port, "cluster")
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                    return False
            return True

        self._wait(ok, "every node reports cluster_state:ok", timeout)

    def wait_synced(self, timeout: float = 30) -> None:
        """Wait until every replica's link to its master is up (a replica that never synced
        is not eligible for promotion)."""

        def synced() -> bool:
            replicas = [_info(p, "replication") for p in self.running()]
            links = [r.get("master_link_status") for r in replicas if r.get("role") == "slave"]
            return len(links) == MASTERS and all(link == "up" for link in links)

        self._wait(synced, "every replica is in sync", timeout)

    def running(self) -> list[int]:
        """Ports of the nodes whose process is alive."""
        return [port for port in self.ports if self.processes[port].poll() is None]

    def masters(self) -> list[int]:
        """Ports of the running nodes that are masters now."""
        return [port for port in self.running() if _info(port, "replication").get("role") == "master"]

    def replica_of(self, master: int) -> int:
        """The port of ``master``'s replica."""
        for port in self.running():
            info = _info(port, "replication")
            if info.get("role") == "slave" and info.get("master_port") == str(master):
                return port
        raise LookupError(f"no replica of {master}")

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (a master crash)."""
        self.processes[port].send_signal(signal.SIGKILL)
        self.processes[port].wait(10)

    def pause(self, port: int) -> None:
        """SIGSTOP the node on ``port`` (a replica that stops acknowledging)."""
        self.processes[port].send_signal(signal.SIGSTOP)

    def resume(self, port: int) -> None:
        """SIGCONT the node on ``port``."""
        self.processes[port].send_signal(signal.SIGCONT)

    def wait_promoted(self, replica: int, timeout: float = 30) -> None:
        """Wait until ``replica`` is a master and the cluster serves every slot again."""
        self._wait(
            lambda: _info(replica, "replication").get("role") == "master", f"{replica} is promoted", timeout
        )
        self.wait_ok(timeout)

    def failover(self, replica: int) -> None:
        """``CLUSTER FAILOVER`` on ``replica`` (a planned switch) and wait until it is a master."""
        assert _reply(replica, "CLUSTER", "FAILOVER").startswith("+OK")
        self.wait_promoted(replica)

    def node_of(self, port: int) -> str:
        """``host:port`` of a node, as redis-py names it."""
        return f"127.0.0.1:{port}"

    def move_slot(self, slot: int, source: int, target: int) -> int:
        """Move ``slot`` with its keys from master ``source`` to master ``target`` (as a reshard does).

        The documented steps: ``IMPORTING`` on the target, ``MIGRATING`` on the source,
        ``MIGRATE`` the keys in batches (a client meeting a moved key gets ``ASK``), then
        ``SETSLOT … NODE`` on every master. Returns how many keys moved.
        """
        nodes = {port: redis_sync.Redis(port=port) for port in self.masters()}
        try:
            source_id, target_id = (
                nodes[p].execute_command("CLUSTER", "MYID").decode() for p in (source, target)
            )
            nodes[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            nodes[source].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            moved = 0
            while keys := nodes[source].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 50):
                nodes[source].execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
            for node in (nodes[target], nodes[source], *nodes.values()):
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            return moved
        finally:
            for node in nodes.values():
                node.close()

    def stop(self) -> None:
        """Kill every node and remove the directory."""
        for process in self.processes.values():
            process.kill()
            process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


_BACKENDS = ("redis", "scenario")
"""Fixtures with a cluster variant, kept only in modules marked ``on_cluster``."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the cluster variants of the backend fixtures' tests outside ``on_cluster`` modules."""
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_cluster = callspec is not None and "cluster" in (callspec.params.get(n) for n in _BACKENDS)
        wanted = not on_cluster or item.get_closest_marker("on_cluster") is not None
        (kept if wanted else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


_shared: list[LocalCluster] = []


def shared_cluster() -> LocalCluster:
    """This process's shared cluster, started on first use."""
    if not _shared:
        _shared.append(LocalCluster().start())
    return _shared[0]


def stop_shared() -> None:
    """Stop the shared cluster if it was started (at the end of the session)."""
    while _shared:
        _shared.pop().stop()


async def flush(client: bus.Redis) -> None:
    """Empty every master (a cluster test's fresh start); functions stay loaded."""
    await client.flushdb(target_nodes=RedisCluster.PRIMARIES)  # type: ignore[call-arg]


@pytest.fixture(scope="session")
def cluster() -> LocalCluster:
    """The session's 6-node cluster (started once per test process)."""
    return shared_cluster()


@pytest.fixture
def fresh_cluster() -> Iterator[LocalCluster]:
    """A 6-node cluster of the test's own, for tests that kill or fail over nodes."""
    own = LocalCluster().start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
async def cluster_redis(cluster: LocalCluster) -> AsyncIterator[bus.Redis]:
    """A client of the shared cluster, emptied first."""
    client = bus.connect(cluster.url)
    assert isinstance(client, RedisCluster)
    await flush(client)
    try:
        yield client
    finally:
        await client.aclose()
