"""A parent context's stolen orchestrator credentials start only the children its sagas run.

On a real ``redis-server``, each process its own ACL user and keyring. The attacker holds the
``compose`` orchestrator's Redis user and keyring: ``saga acl`` lets it write the inbox of
``billing``, where its sagas run children, and a start request whose parent link names
``compose`` passes the bus's MAC check there. The billing orchestrator starts only a
definition that ``compose``'s sagas run as a child step (when its registry holds compose's
definitions) or that declares ``parents=("compose",)``; anything else is dead-lettered with
the reason and changes nothing (``saga/definition/lineage.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

import bus
from bus import Envelope
from saga import App, EngineConfig, Saga, SagaClient, SagaStatus, SagaWorker
from saga.core.model import ParentLink
from saga.ops.keyrings import issue_keyrings
from saga.runtime.protocol import START, StartRequest
from saga.store.keys import Partition
from tests.faults.servers import PrivateRedis
from tests.helpers import dead_letters
from tests.saga import compose_sagas
from tests.saga.compose_sagas import Plan, billing_saga
from tests.security.acl_users import Users, applied
from tests.security.test_acl import web_client, worker_in

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

COMPOSE = compose_sagas.CONTEXT
BILLING = Partition("billing", 0)


refunds = billing_saga("refunds")
"""Billing's definition that no saga of compose runs as a child (shop's does)."""
settle = billing_saga("settle", parents=[COMPOSE])
"""Billing's definition that declares compose its parent (compose's code need not be there)."""
shopping: Saga[Plan] = Saga("shopping", context="shop", data=Plan)
shopping.child("refund", saga=refunds, data=lambda plan: plan)

WHOLE = App(
    "all",
    sagas=[compose_sagas.parent, compose_sagas.invoicing, refunds, settle, shopping],
    participants=[worker_in(COMPOSE), worker_in("billing"), worker_in("shop")],
)
"""What ``saga acl`` and ``saga keys issue`` are run on: compose and shop run children in billing."""


async def _user_of_both(users: Users, *of: str) -> bus.Redis:
    """One process serving several contexts: a Redis user holding each of their users' grants."""
    name, first, rest = "redsaga.both", of[0], of[1:]
    await users.admin.execute_command("ACL", "SETUSER", name, *users.users[first].rules(f"pw-{name}"))
    resets = {"reset", "on", "nopass", "-@all", "resetkeys", "resetchannels"}
    for other in rest:
        grants = [rule for rule in users.users[other].rules(None) if rule not in resets]
        await users.admin.execute_command("ACL", "SETUSER", name, *grants)
    client = bus.connect(users.server.url.replace("redis://", f"redis://{name}:pw-{name}@"))
    users.clients.append(client)
    return client


def _signing_as(users: Users, *principals: str) -> EngineConfig:
    keyrings = issue_keyrings(users.master, users.reach, list(principals))
    return EngineConfig(bus=bus.BusConfig(lease_ms=5_000), auth=bus.Authenticator(keyrings))


async def _forge_start(users: Users, parent: str, definition: Saga[Any], saga_id: str) -> None:
    """What the stolen user and keyring of ``parent``'s orchestrator write: a signed start of
    ``definition`` in billing, its parent link naming ``parent`` (so the child's end goes there)."""
    link = ParentLink(
        context=parent, partition=0, saga_id="made-up", saga="any@1", step="s", attempt=1, command_id="c"
    )
    request = StartRequest(
        saga=definition.key,
        data=msgspec.Raw(msgspec.json.encode(Plan(id=saga_id))),
        by="mallory",
        parent=link,
    )
    entry = Envelope(id=bus.uuid7(), type=START, correlation_id=saga_id, payload=msgspec.json.encode(request))
    signer = f"orchestrator:{parent}"
    signed = users.auth(signer).sign(entry, "orchestrator:billing", signer)
    await users.client(f"redsaga.{parent}").xadd(BILLING.inbox.key, signed.to_fields())  # type: ignore[arg-type]


async def _reasons(users: Users) -> list[str]:
    return [letter["reason"] for letter in await dead_letters(users.admin, BILLING.inbox)]


async def _step(workers: Iterable[SagaWorker], rounds: int = 1) -> None:
    for _ in range(rounds):
        for worker in workers:
            await worker.run_until_idle()


async def test_with_the_parents_definitions_at_hand_a_stolen_parent_starts_only_its_children(
    private_redis_server: PrivateRedis,
) -> None:
    async with applied(private_redis_server, WHOLE) as users:
        # one process serves compose and billing (the usual case): it has compose's definitions
        both = App("both", sagas=[compose_sagas.parent, compose_sagas.invoicing, refunds])
        workers = [
            SagaWorker(
                await _user_of_both(users, f"redsaga.{COMPOSE}", "redsaga.billing"),
                both,
                config=_signing_as(users, f"orchestrator:{COMPOSE}", "orchestrator:billing"),
            ),
            SagaWorker(
                users.client(f"redsaga.{COMPOSE}.worker"),
                App("w1", participants=[worker_in(COMPOSE)]),
                config=users.config("participant:worker"),
            ),
            SagaWorker(
                users.client("redsaga.billing.worker"),
                App("w2", participants=[worker_in("billing")]),
                config=users.config("participant:worker"),
            ),
        ]
        await _forge_start(users, COMPOSE, refunds, "r1")
        await _step(workers)
        assert not await users.admin.exists(BILLING.saga("r1"))
        [reason] = await _reasons(users)
        assert "signed by orchestrator:compose, which may not send it" in reason
        assert "saga refunds@1 is not a child of context compose" in reason
        # the child it does run still starts, and the parent completes
        client: SagaClient = web_client(users, WHOLE)
        await client.start(compose_sagas.parent, Plan(id="p1"), saga_id="p1", wait_s=0)
        await _step(workers, rounds=6)
        assert (await client.get("p1", context=COMPOSE)).status == SagaStatus.COMPLETED
        assert (await client.get("p1/bill", context="billing")).status == SagaStatus.COMPLETED
        assert len(await _reasons(users)) == 1
        assert await users.denials() == []  # refused by the orchestrator, not by Redis


async def test_without_them_a_definitions_declared_parents_decide(private_redis_server: PrivateRedis) -> None:
    async with applied(private_redis_server, WHOLE) as users:
        # billing deployed on its own: none of compose's or shop's code here
        alone = App("billing", sagas=[compose_sagas.invoicing, refunds, settle])
        config = users.config("orchestrator:billing")
        billing = SagaWorker(users.client("redsaga.billing"), alone, config=config)
        await _forge_start(users, COMPOSE, settle, "s1")  # its declared parent
        await _forge_start(users, "shop", settle, "s2")  # a parent it does not declare
        with capture_logs() as logs:
            await _forge_start(users, "shop", refunds, "r2")  # nothing here says: accepted, as before
            await _step([billing])
        assert await users.admin.exists(BILLING.saga("s1"))
        assert not await users.admin.exists(BILLING.saga("s2"))
        [reason] = await _reasons(users)
        assert "StartRequested for saga s2 signed by orchestrator:shop, which may not send it" in reason
        assert "saga settle@1 is not a child of context shop (it declares parents=('compose',))" in reason
        assert await users.admin.exists(BILLING.saga("r2"))
        [unchecked] = [log for log in logs if "accepted unchecked" in log["event"]]
        assert (unchecked["parent"], unchecked["saga"]) == ("shop", "refunds@1")
        assert "declare parents=" in unchecked["event"]
        assert await users.denials() == []
