"""Entries bound to their saga's incarnation: a child's end report, and entries without stamps.

On real Redis, each process its own ACL user and keyring. A child saga's end report names
the incarnation of the parent that started the child, so a genuine report copied back into
a later parent under the same id is dead-lettered as a replay (not only while the inbox's
dedupe window still holds its id). A saga started by this release refuses a reply or a
timer firing that names no incarnation, as a release before the stamps wrote them.
"""

from __future__ import annotations

import msgspec
import pytest

from bus import Envelope
from bus._envelope import decode_fields
from saga import App, SagaStatus, SagaWorker
from saga.core.states import StepStatus
from saga.store.keys import Partition
from tests.faults.servers import PrivateRedis
from tests.helpers import dead_letters
from tests.saga import compose_sagas
from tests.security.acl_users import Users, applied
from tests.security.test_acl import STATELESS, principal_of, web_client, worker_in, workers_of
from tests.security.test_attacks import ORDER, ORDERS, World, world

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
__all__ = ["world"]  # the fixture, shared with test_attacks

PARENTS = Partition(compose_sagas.CONTEXT, 0)
CHILDREN = Partition("billing", 0)
ROLES = {
    f"redsaga.{compose_sagas.CONTEXT}": App("compose", sagas=[compose_sagas.parent]),
    "redsaga.billing": App("billing", sagas=[compose_sagas.invoicing]),
    f"redsaga.{compose_sagas.CONTEXT}.worker": App("w1", participants=[worker_in(compose_sagas.CONTEXT)]),
    "redsaga.billing.worker": App("w2", participants=[worker_in("billing")]),
}
WHOLE = App(
    "all",
    sagas=[compose_sagas.parent, compose_sagas.invoicing],
    participants=[worker_in(compose_sagas.CONTEXT), worker_in("billing")],
)


def _envelope(fields: dict[bytes, bytes]) -> Envelope:
    return decode_fields(fields, max_bytes=1 << 20, max_fields=16)


class _Family:
    """The parent and child contexts' processes, stepped with ``run_until_idle``."""

    def __init__(self, users: Users) -> None:
        self.users = users
        self.workers = dict(zip(ROLES, workers_of(users, ROLES), strict=True))
        self.client = web_client(users, ROLES[f"redsaga.{compose_sagas.CONTEXT}"])

    async def step(self, *names: str) -> None:
        for name in names or self.workers:
            await self.workers[name].run_until_idle()

    async def parent(self) -> SagaStatus:
        return (await self.client.get("p1", context=compose_sagas.CONTEXT)).status

    async def settle(self) -> None:
        for _ in range(12):
            await self.step()
            if (await self.parent()).terminal:
                return
        raise AssertionError("the parent did not end in 12 rounds")


async def test_a_childs_end_report_replayed_into_a_later_parent_is_dead_lettered(
    private_redis_server: PrivateRedis,
) -> None:
    async with applied(private_redis_server, WHOLE) as users:
        family = _Family(users)
        plan = compose_sagas.Plan(id="p1")
        await family.client.start(compose_sagas.parent, plan, saga_id="p1", wait_s=0)
        await family.settle()
        assert await family.parent() == SagaStatus.COMPLETED
        operator = users.client("redsaga.operator")  # it may read the inbox
        [report] = [
            fields
            for _, fields in await operator.xrange(PARENTS.inbox.key)
            if _envelope(fields).headers.get("replied-by") == "p1/bill"
        ]
        for key in (  # what retention does once both ended (the admin plays the TTL)
            PARENTS.saga("p1"), PARENTS.history("p1"), PARENTS.branches("p1"),
            CHILDREN.saga("p1/bill"), CHILDREN.history("p1/bill"), CHILDREN.branches("p1/bill"),
        ):  # fmt: skip
            await users.admin.delete(key)

        await family.client.start(compose_sagas.parent, plan, saga_id="p1", wait_s=0)
        compose = f"redsaga.{compose_sagas.CONTEXT}"
        for _ in range(3):  # reserve, then the child's start; the child's context is not run
            await family.step(compose, f"{compose}.worker")
        state = await family.client.get("p1", context=compose_sagas.CONTEXT)
        assert state.steps["bill"].status == StepStatus.DISPATCHED
        # the child context's stolen user, which may write the parent's inbox (its reports go there)
        await users.client("redsaga.billing").xadd(PARENTS.inbox.key, report)  # type: ignore[arg-type]
        await family.step(compose)
        state = await family.client.get("p1", context=compose_sagas.CONTEXT)
        assert state.steps["bill"].status == StepStatus.DISPATCHED  # the old report completed nothing
        [letter] = await dead_letters(users.admin, PARENTS.inbox)
        assert "belongs to its incarnation created at" in letter["reason"]
        assert "a replay" in letter["reason"]
        await family.settle()  # the child of this incarnation reports (under an id of its own)
        assert await family.parent() == SagaStatus.COMPLETED


async def _old_reply(world: World) -> None:
    """Inventory's genuine reply to the saga's stock reservation as a release before the stamps
    wrote it: no incarnation header (signed with inventory's own keyring, added with its user)."""
    attempt = (await world.state()).steps["reserve_stock"].attempts[-1]
    reply = Envelope(
        id=f"{attempt.command_id}:r",
        type="StockReserved",
        payload=msgspec.json.encode({"reservation_id": "r-old"}),
        source="inventory",
        correlation_id=ORDER.id,
        causation_id=attempt.command_id,
        attempt=1,
        headers={"saga": "order_fulfilment@1", "step": "reserve_stock", "kind": "do"},
    )
    signed = world.users.auth("participant:inventory").sign(
        reply, "orchestrator:orders", "participant:inventory"
    )
    await world.users.client("redsaga.orders.inventory").xadd(ORDERS.inbox.key, signed.to_fields())  # type: ignore[arg-type]
    await world.step("redsaga.orders")


async def test_a_reply_without_stamps_is_refused_by_a_saga_started_with_them(world: World) -> None:
    assert (await world.state()).stamped
    await _old_reply(world)
    assert (await world.state()).steps["reserve_stock"].status == StepStatus.DISPATCHED
    [reason] = await world.reasons()
    assert "names no incarnation, but every entry of this saga does" in reason
    await world.settle()  # inventory's own, stamped reply still moves it
    assert (await world.state()).status == SagaStatus.COMPLETED


async def test_a_saga_started_before_the_stamps_still_takes_replies_without_them(world: World) -> None:
    """Its commands went out unstamped (an upgrade mid-run): their replies are taken."""
    key = ORDERS.saga(ORDER.id)
    meta = msgspec.msgpack.decode(await world.users.admin.hget(key, "meta"))
    del meta["t"]  # the saga hash as a release before the stamps wrote it
    await world.users.admin.hset(key, "meta", msgspec.msgpack.encode(meta))
    assert not (await world.state()).stamped
    name = "redsaga.orders"  # an orchestrator that has not kept the saga as it wrote it
    world.workers[name] = SagaWorker(
        world.users.client(name),
        STATELESS[name],
        config=world.users.config(principal_of(name)),
        consumer=name,
    )
    await _old_reply(world)
    assert await world.reasons() == []
    state = await world.state()
    assert state.steps["reserve_stock"].status == StepStatus.SUCCEEDED
    assert msgspec.json.decode(state.steps["reserve_stock"].output)["reservation_id"] == "r-old"


async def test_a_timer_firing_without_stamps_is_refused_by_a_saga_started_with_them(world: World) -> None:
    """A firing as a release before the stamps wrote it: the timer's event without the times."""
    timer_id = (await world.state()).steps["reserve_stock"].timer
    assert timer_id is not None
    fired = Envelope(
        id=timer_id,
        type="TimerFired",
        payload=msgspec.json.encode(["timeout", "reserve_stock", "do", 1]),
        correlation_id=ORDER.id,
    )
    signed = world.users.auth("orchestrator:orders").sign(fired, "orchestrator:orders", "orchestrator:orders")
    await world.users.admin.zrem(ORDERS.timers, timer_id)  # as if the scheduler had fired it
    await world.redis.xadd(ORDERS.inbox.key, signed.to_fields())  # type: ignore[arg-type]
    await world.step("redsaga.orders")
    assert (await world.state()).steps["reserve_stock"].status == StepStatus.DISPATCHED  # not timed out
    [reason] = await world.reasons()
    assert "TimerFired for saga o-1 names no incarnation" in reason
