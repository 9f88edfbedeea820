"""What one stolen participant's credentials can do, on a real ``redis-server``.

The example system runs with every process as its own ACL user (``saga acl``) signing with its
own keyring (``saga keys issue``). The attacker holds the payments participant's Redis user
and keyring: everything it tries here was possible before entries were signed and the users
were narrowed, and each is now refused by Redis (``NOPERM``) or dead-lettered by the
orchestrator with its reason, and the saga does not move.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from redis import exceptions as rx

import bus
from bus import Envelope
from redsaga.examples import stateless
from redsaga.examples.contracts import Line, Order, StockReserved
from redsaga.examples.orders import order_fulfilment
from saga import App, DefinitionError, InvalidInput, Participant, SagaState, SagaStatus, SagaWorker
from saga.core.model import NULL
from saga.runtime.protocol import CANCEL, FORCE, SIGNAL, OperatorRequest, SignalDelivery
from saga.store.keys import Partition
from tests.faults.servers import PrivateRedis
from tests.helpers import dead_letters
from tests.security.acl_users import Users, applied
from tests.security.test_acl import STATELESS, principal_of, web_client

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
ORDERS = Partition("orders", 0)
ORDER = Order(id="o-1", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=900)
ATTACKER = "redsaga.orders.payments"


class World:
    """The system on its ACL users, stepped with ``run_until_idle``; the attacker's tools."""

    def __init__(self, users: Users) -> None:
        self.users = users
        self.workers = {
            name: SagaWorker(users.client(name), app, config=users.config(principal_of(name)), consumer=name)
            for name, app in STATELESS.items()
        }
        self.client = web_client(users, STATELESS["redsaga.orders"])
        self.redis = users.client(ATTACKER)  # the stolen Redis user
        self.keyring = users.auth("participant:payments")  # and the stolen keyring

    async def step(self, *names: str) -> None:
        for name in names or self.workers:
            await self.workers[name].run_until_idle()

    async def settle(self, rounds: int = 12) -> None:
        """Step every worker until the saga ends (it crosses all of them)."""
        for _ in range(rounds):
            await self.step()
            if (await self.state()).status.terminal:
                return
        raise AssertionError(f"the saga did not end in {rounds} rounds")

    async def state(self) -> SagaState:
        return await self.client.get(ORDER.id)

    async def forge(self, kind: str, payload: bytes, **fields: object) -> None:
        """An inbox entry of ``kind`` about the saga, signed with the stolen keyring and added
        with the stolen user (which may add to the inbox: its replies go there)."""
        envelope = Envelope(id=bus.uuid7(), type=kind, payload=payload, correlation_id=ORDER.id, **fields)  # type: ignore[arg-type]
        signed = self.keyring.sign(envelope, "orchestrator:orders", "participant:payments")
        await self.redis.xadd(ORDERS.inbox.key, signed.to_fields())  # type: ignore[arg-type]

    async def reasons(self) -> list[str]:
        return [letter["reason"] for letter in await dead_letters(self.users.admin, ORDERS.inbox)]


@pytest.fixture
async def world(private_redis_server: PrivateRedis) -> AsyncIterator[World]:
    async with applied(private_redis_server, stateless.app) as users:
        found = World(users)
        await found.client.start(order_fulfilment, ORDER, saga_id=ORDER.id, wait_s=0)
        await found.step("redsaga.orders")  # the saga starts; reserve_stock waits for inventory
        yield found


async def refused(call: object) -> None:
    with pytest.raises(rx.NoPermissionError):
        await call  # type: ignore[misc]


async def test_a_reply_forged_for_another_participants_step_is_dead_lettered(world: World) -> None:
    before = await world.state()
    command_id = before.steps["reserve_stock"].attempts[-1].command_id
    headers = {"saga": "order_fulfilment@1", "step": "reserve_stock", "kind": "do"}
    payload = msgspec.json.encode(StockReserved(reservation_id="never"))
    await world.forge("StockReserved", payload, causation_id=command_id, headers=headers)
    await world.step("redsaga.orders")
    assert (await world.state()).steps["reserve_stock"] == before.steps["reserve_stock"]
    [reason] = await world.reasons()
    assert "signed by participant:payments, which may not send it (only participant:inventory)" in reason
    await world.settle()  # inventory's own reply still moves the saga
    assert (await world.state()).status == SagaStatus.COMPLETED


@pytest.mark.parametrize(
    ("kind", "payload", "why"),
    [
        (SIGNAL, SignalDelivery(step="charge_payment", n=1, data=NULL), "signed by participant:payments"),
        (CANCEL, OperatorRequest(by="admin", reason="forged"), "may not send it"),
        (
            FORCE,
            OperatorRequest(by="admin", reason="x", step="reserve_stock", output=NULL),
            "may not send it",
        ),
    ],
    ids=["signal", "cancel", "force-complete"],
)
async def test_engine_and_operator_messages_from_a_participant_are_dead_lettered(
    world: World, kind: str, payload: object, why: str
) -> None:
    before = await world.state()
    await world.forge(kind, msgspec.json.encode(payload))
    await world.step("redsaga.orders")
    after = await world.state()
    assert (after.status, after.revision, after.cancel) == (before.status, before.revision, None)
    [reason] = await world.reasons()
    assert why in reason or "signal refused" in reason


async def test_the_participant_cannot_stop_every_worker_through_the_epoch(world: World) -> None:
    epoch = await world.users.admin.get(bus.EPOCH_KEY)
    await refused(world.redis.set(bus.EPOCH_KEY, "x"))
    await refused(world.redis.delete(bus.EPOCH_KEY))
    for other in ("redsaga.client", "redsaga.relay", "redsaga.operator"):
        await refused(world.users.client(other).set(bus.EPOCH_KEY, "x"))
    assert await world.users.admin.get(bus.EPOCH_KEY) == epoch


async def test_the_participant_reaches_no_reply_dead_letter_group_or_lua_of_others(world: World) -> None:
    inbox, dlq, published = ORDERS.inbox.key, ORDERS.inbox.dlq_key, ORDERS.inbox.published_key
    redis = world.redis
    await refused(redis.xrange(inbox))  # other participants' replies
    await refused(redis.xrange(dlq))
    await refused(redis.xdel(dlq, "0-1"))
    await refused(redis.delete(inbox))
    await refused(redis.xtrim(inbox, maxlen=0))
    await refused(redis.xack(inbox, "orchestrator", "0-1"))
    await refused(redis.xreadgroup("orchestrator", "me", {inbox: ">"}))
    await refused(redis.xgroup_delconsumer(inbox, "orchestrator", "redsaga.orders"))
    await refused(redis.zremrangebyscore(published, "-inf", "+inf"))  # the publish dedupe window
    await refused(redis.eval("while true do end", 0))  # a busy loop stalling Redis for everyone
    await refused(redis.hgetall(ORDERS.saga(ORDER.id)))
    assert await world.users.admin.xlen(inbox) >= 1  # untouched


async def test_no_id_or_name_moves_a_key_under_the_participants_patterns(world: World) -> None:
    with pytest.raises(InvalidInput, match="invalid saga id"):
        await world.client.start(order_fulfilment, ORDER, saga_id="x}:inbox")
    crafted = ORDERS.saga("x}:inbox")  # as if it existed: the patterns are anchored
    await world.users.admin.hset(crafted, "status", "running")
    await refused(world.redis.hgetall(crafted))
    await refused(world.redis.hset(crafted, "status", "completed"))
    await refused(world.redis.delete(crafted))
    with pytest.raises(DefinitionError, match="invalid participant name"):
        Participant("pay*", serves=["orders"])


async def test_the_operator_reads_no_secret_and_can_make_no_token(world: World) -> None:
    operator = world.users.client("redsaga.operator")
    assert not await world.users.admin.exists(f"rs:{{{ORDERS.context}:meta}}:signal-secret")  # none kept
    await world.users.admin.set(f"rs:{{{ORDERS.context}:meta}}:signal-secret", "if one were kept")
    await refused(operator.get(f"rs:{{{ORDERS.context}:meta}}:signal-secret"))
    assert await operator.hgetall(ORDERS.saga(ORDER.id))  # it reads the sagas


async def test_an_undo_reply_that_is_not_json_is_dead_lettered_and_the_saga_stays_readable(
    world: World,
) -> None:
    before = await world.state()
    command_id = before.steps["reserve_stock"].attempts[-1].command_id
    headers = {
        "saga": "order_fulfilment@1",
        "step": "reserve_stock",
        "kind": "undo",
        "inc": str(before.created_ms),
    }
    envelope = Envelope(
        id=bus.uuid7(), type="StockReleased", payload=b"\xff not json", correlation_id=ORDER.id,
        causation_id=command_id, headers=headers,
    )  # fmt: skip
    inventory = world.users.auth("participant:inventory")  # a participant with a bug, not forged
    signed = inventory.sign(envelope, "orchestrator:orders", "participant:inventory")
    await world.users.client("redsaga.orders.inventory").xadd(ORDERS.inbox.key, signed.to_fields())  # type: ignore[arg-type]
    await world.step("redsaga.orders")
    [reason] = await world.reasons()
    assert "is not a valid JSON value" in reason
    assert (await world.state()).revision == before.revision  # and still decodes


def test_a_context_app_with_a_wildcard_participant_cannot_be_built() -> None:
    with pytest.raises(DefinitionError):
        App("x", participants=[Participant("pay?", serves=["orders"])])
