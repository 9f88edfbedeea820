"""The generated ACL users on a real 6-node Redis Cluster: applied on every node, the demo's
saga system runs with each process as its own user and no node refuses anything.

A cluster client reads the topology (``CLUSTER SLOTS``) and the command table (``COMMAND``)
when it connects, so every generated user may run those two; ACL users are per node, so the
lines are applied on each (masters and replicas: a promoted replica needs them too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis as redis_sync

import bus
from bus._epoch import join_epoch
from bus._scripts import load_libraries
from redsaga.cli._functions import libraries
from redsaga.examples.all import app as demo
from saga import SagaStatus
from saga.ops.acl import acl_rules
from saga.ops.keyrings import reach_of
from tests.cluster import LocalCluster
from tests.security.acl_users import Users
from tests.security.test_acl import STATELESS, order, outbox_demo_as_users, run_orders

pytestmark = [pytest.mark.anyio, pytest.mark.cluster]


class ClusterUsers(Users):
    """:class:`Users` of a cluster: logins by ``redis+cluster://name:password@…``, denials of every node."""

    def client(self, name: str) -> bus.Redis:
        assert name in self.users, name
        client = bus.connect(
            self.server.url.replace("redis+cluster://", f"redis+cluster://{name}:pw-{name}@")
        )
        self.clients.append(client)
        return client

    async def denials(self) -> list[dict[str, object]]:
        """``ACL LOG`` of every node."""
        found: list[dict[str, object]] = []
        for port in self.server.ports:
            with redis_sync.Redis(port=port) as node:
                found += node.acl_log()
        return found


@pytest.fixture
async def users(fresh_cluster: LocalCluster) -> AsyncIterator[Users]:
    generated = {u.name: u for u in acl_rules(demo)}
    for port in fresh_cluster.ports:
        with redis_sync.Redis(port=port) as node:
            for user in generated.values():
                node.execute_command("ACL", "SETUSER", user.name, *user.rules(f"pw-{user.name}"))
    admin = bus.connect(fresh_cluster.url)
    await load_libraries(admin, libraries())  # on every master
    await join_epoch(admin)
    for port in fresh_cluster.ports:
        with redis_sync.Redis(port=port) as node:
            node.acl_log_reset()
    server = SimpleNamespace(url=fresh_cluster.url, ports=fresh_cluster.ports)
    found = ClusterUsers(server, admin, generated, [], reach_of(demo, clients=["web"], operators=["oncall"]))  # type: ignore[arg-type]
    try:
        yield found
    finally:
        for client in [*found.clients, admin]:
            await client.aclose()


async def test_the_demo_runs_on_a_cluster_with_one_user_per_process_and_no_node_refuses(users: Users) -> None:
    orders = {"ok": order(1), "declined": order(2, card="declined"), "no-carrier": order(3, region="nowhere")}
    states = await run_orders(users, STATELESS, orders)
    assert states == {
        "ok": SagaStatus.COMPLETED,
        "declined": SagaStatus.COMPENSATED,
        "no-carrier": SagaStatus.COMPENSATED,
    }
    assert await users.denials() == []


async def test_the_outbox_demo_replies_through_relays_as_the_relay_user_on_a_cluster(
    users: Users, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relays publish each hash tag's rows on its own master, as the relay user."""
    await outbox_demo_as_users(users, tmp_path, monkeypatch)
