"""Applying an App's generated ACL users on a private server, and logging in as one of them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import bus
from bus._scripts import load_libraries
from cli._functions import libraries
from saga import AclUser, App, acl_rules
from tests.faults.servers import PrivateRedis


@dataclass
class Users:
    """A private server with the demo's ACL users applied; ``client(name)`` logs in as one."""

    server: PrivateRedis
    admin: bus.Redis
    users: dict[str, AclUser]
    clients: list[bus.Redis]

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
    """``app``'s generated users applied on ``server`` (password ``pw-<name>``) and redsaga's
    function libraries loaded by the admin (no generated user may load them), ACL LOG cleared."""
    admin = bus.connect(server.url)
    generated = {u.name: u for u in acl_rules(app)}
    for user in generated.values():
        await admin.execute_command("ACL", "SETUSER", user.name, *user.rules(f"pw-{user.name}"))
    await load_libraries(admin, libraries())  # what `saga functions load` does
    await admin.acl_log_reset()
    found = Users(server, admin, generated, [])
    try:
        yield found
    finally:
        for client in [*found.clients, admin]:
            await client.aclose()
