"""Applying an App's generated ACL users on a private server, and logging in as one of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import bus
from bus._epoch import join_epoch
from bus._scripts import load_libraries
from redsaga.cli._functions import libraries
from saga import App, EngineConfig
from saga.ops.acl import acl_rules
from saga.ops.acl_grants import AclUser
from saga.ops.keyrings import MasterFile, Reach, issue_keyrings, new_master, reach_of
from tests.faults.servers import PrivateRedis


@dataclass
class Users:
    """A private server with an app's ACL users applied; ``client(name)`` logs in as one,
    ``config(principal)`` signs as one (a keyring issued for that principal only)."""

    server: PrivateRedis
    admin: bus.Redis
    users: dict[str, AclUser]
    clients: list[bus.Redis]
    reach: dict[str, Reach] = field(default_factory=dict)
    master: MasterFile = field(default_factory=new_master)

    def auth(self, principal: str) -> bus.Authenticator:
        """An authenticator holding ``principal``'s keyring only."""
        return bus.Authenticator(issue_keyrings(self.master, self.reach, [principal]))

    def config(self, principal: str) -> EngineConfig:
        """An engine config that signs as ``principal``, with a short lease for tests."""
        return EngineConfig(bus=bus.BusConfig(lease_ms=5_000), auth=self.auth(principal))

    def client(self, name: str) -> bus.Redis:
        assert name in self.users, name
        client = bus.connect(self.server.url.replace("redis://", f"redis://{name}:pw-{name}@"))
        self.clients.append(client)
        return client

    async def denials(self) -> list[dict[str, object]]:
        """``ACL LOG``: every command or key Redis refused since the users were applied."""
        return list(await self.admin.acl_log())


@asynccontextmanager
async def applied(server: PrivateRedis, app: App) -> AsyncIterator[Users]:
    """``app``'s generated users applied on ``server`` (password ``pw-<name>``), redsaga's
    function libraries loaded by the admin (no generated user may load them), the deployment's
    epoch set (as its first orchestrator would), ACL LOG cleared."""
    admin = bus.connect(server.url)
    generated = {u.name: u for u in acl_rules(app)}
    for user in generated.values():
        await admin.execute_command("ACL", "SETUSER", user.name, *user.rules(f"pw-{user.name}"))
    await load_libraries(admin, libraries())  # what `saga functions load` does
    await join_epoch(admin)
    await admin.acl_log_reset()
    found = Users(server, admin, generated, [], reach_of(app, clients=["web"], operators=["oncall"]))
    try:
        yield found
    finally:
        for client in [*found.clients, admin]:
            await client.aclose()
