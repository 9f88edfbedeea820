"""The seams of the trust boundary, on a real ``redis-server`` with every process its own ACL
user and keyring: what an attacker holding one principal's stolen credentials tries with
entries that were once genuine (replayed into another incarnation, fired early), with another
context's orchestrator, and with nothing signed at all. Each is refused: by Redis
(``NOPERM``), by the orchestrator (dead-lettered with its reason), or it changes nothing.
"""

from __future__ import annotations

import msgspec
import pytest
from structlog.testing import capture_logs

import bus
from bus import AuthError, Envelope
from bus._envelope import decode_fields
from bus.lowlevel import KEYRING_ENV, VERIFY_ENV
from redsaga.examples.contracts import Order
from redsaga.examples.orders import order_fulfilment
from saga import App, EngineConfig, SagaClient, SagaStatus, SagaWorker
from saga.core.model import ParentLink
from saga.core.states import StepStatus
from saga.runtime.protocol import CANCEL, START, OperatorRequest, StartRequest
from saga.store.keys import Partition
from tests.faults.servers import PrivateRedis
from tests.helpers import dead_letters
from tests.saga import compose_sagas
from tests.security.acl_users import applied
from tests.security.test_acl import STATELESS, worker_in
from tests.security.test_attacks import ORDER, ORDERS, World, world

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
__all__ = ["world"]  # the fixture, shared with test_attacks


def _envelope(fields: dict[bytes, bytes]) -> Envelope:
    return decode_fields(fields, max_bytes=1 << 20, max_fields=16)


async def _expire(world: World, saga_id: str) -> None:
    """What the saga's retention does when it ends: its keys go (the admin plays the TTL)."""
    admin = world.users.admin
    for key in (ORDERS.saga(saga_id), ORDERS.history(saga_id), ORDERS.branches(saga_id)):
        await admin.delete(key)


async def test_a_reply_replayed_into_a_later_incarnation_completes_nothing(world: World) -> None:
    await world.settle()  # the first incarnation ends
    operator = world.users.client("redsaga.operator")  # it may read the inbox
    [reply] = [
        fields
        for _, fields in await operator.xrange(ORDERS.inbox.key)
        if _envelope(fields).type == "StockReserved"
    ]
    await _expire(world, ORDER.id)
    again = Order(id=ORDER.id, customer="c2", lines=ORDER.lines, total_cents=ORDER.total_cents + 1)
    await world.client.start(order_fulfilment, again, saga_id=ORDER.id, wait_s=0)
    await world.step("redsaga.orders")  # reserve_stock waits for inventory, again
    assert (await world.state()).steps["reserve_stock"].status == StepStatus.DISPATCHED
    await world.redis.xadd(ORDERS.inbox.key, reply)  # type: ignore[arg-type] - the stolen user adds it
    await world.step("redsaga.orders")
    assert (await world.state()).steps["reserve_stock"].status == StepStatus.DISPATCHED
    [reason] = await world.reasons()
    assert "belongs to its incarnation created at" in reason
    assert "a replay" in reason
    await world.settle()  # inventory's own reply to this incarnation still moves it
    assert (await world.state()).status == SagaStatus.COMPLETED


@pytest.mark.parametrize("who", ["worker", "client"])
async def test_an_embedded_worker_or_client_without_a_keyring_refuses_to_run(
    world: World, who: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker would act on a participant's unsigned forgery of another's reply; a client
    would write commands and timers that a signing worker dead-letters."""
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    monkeypatch.delenv(KEYRING_ENV, raising=False)
    redis = world.users.client("redsaga.orders" if who == "worker" else "redsaga.client")
    app = STATELESS["redsaga.orders"]
    build = SagaWorker if who == "worker" else lambda r, a, config: SagaClient(r, a.registry, config=config)
    with pytest.raises(AuthError, match="signing is off: the Saga") as refused:
        build(redis, app, config=EngineConfig())
    assert "REDSAGA_VERIFY=off" in str(refused.value)


@pytest.mark.parametrize("off", [{"REDSAGA_VERIFY": "off"}, {}], ids=["environment", "config"])
def test_signing_turned_off_on_purpose_runs_and_says_so_at_start_up(
    off: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    for name, value in off.items():
        monkeypatch.setenv(name, value)
    config = EngineConfig() if off else EngineConfig(auth=bus.SIGNING_OFF)
    with capture_logs() as logs:
        SagaWorker(bus.connect("redis://127.0.0.1:1/0"), STATELESS["redsaga.orders"], config=config)
    warned = {
        log["process"]: log["log_level"] for log in logs if log["event"].startswith("running unauthenticated")
    }
    assert warned == {"the worker of 'orders'": "warning"}  # once, by the bus worker under it


def _fired(timer_id: str, stored: bytes) -> dict[str, bytes]:
    """The entry ``fire_timers.lua`` would add for a timer stored as ``stored`` (its MAC kept)."""
    length, _, rest = stored.partition(b":")
    saga_id, rest = rest[: int(length)], rest[int(length) :]
    signed, _, rest = rest.partition(b":")
    auth, event = rest[: int(signed)], rest[int(signed) :]
    key_id, _, mac = auth.partition(b" ")
    envelope = Envelope(
        id=timer_id, type="TimerFired", payload=event, correlation_id=saga_id.decode(),
        signer="orchestrator:orders", key_id=key_id.decode(), mac=mac,
    )  # fmt: skip
    return envelope.to_fields()  # type: ignore[return-value]


async def test_a_pending_timer_added_to_the_inbox_early_is_dead_lettered(world: World) -> None:
    before = await world.state()
    timer_id = before.steps["reserve_stock"].timer
    assert timer_id is not None  # the attempt's timeout, due in 30 s
    stored = await world.users.admin.hget(ORDERS.timer_data, timer_id)  # leaked: a dump, a backup
    await world.redis.xadd(ORDERS.inbox.key, _fired(timer_id, stored))  # type: ignore[arg-type]
    await world.step("redsaga.orders")
    after = await world.state()
    assert after.steps["reserve_stock"] == before.steps["reserve_stock"]  # not timed out
    [reason] = await world.reasons()
    assert "while the timer is still pending" in reason
    assert "fired early, not by the scheduler" in reason
    await world.settle()
    assert (await world.state()).status == SagaStatus.COMPLETED


async def test_a_fired_timer_replayed_into_a_later_incarnation_is_dead_lettered(world: World) -> None:
    timer_id = (await world.state()).steps["reserve_stock"].timer
    assert timer_id is not None
    fired = _fired(timer_id, await world.users.admin.hget(ORDERS.timer_data, timer_id))
    await world.settle()  # the first incarnation ends; its timeout is cancelled
    await _expire(world, ORDER.id)
    again = Order(id=ORDER.id, customer="c2", lines=ORDER.lines, total_cents=ORDER.total_cents + 1)
    await world.client.start(order_fulfilment, again, saga_id=ORDER.id, wait_s=0)
    await world.step("redsaga.orders")  # the same timer id is pending again, for this incarnation
    await world.users.admin.zrem(ORDERS.timers, timer_id)  # as if the scheduler were about to fire it
    await world.redis.xadd(ORDERS.inbox.key, fired)  # type: ignore[arg-type]
    await world.step("redsaga.orders")
    assert (await world.state()).steps["reserve_stock"].status == StepStatus.DISPATCHED
    [reason] = await world.reasons()
    assert "belongs to its incarnation created at" in reason


@pytest.mark.parametrize("link", [False, True], ids=["no-parent-link", "claiming-to-be-the-parent"])
async def test_a_child_contexts_orchestrator_starts_and_cancels_nothing_in_its_parent_context(
    private_redis_server: PrivateRedis, link: bool
) -> None:
    whole = App(
        "all",
        sagas=[compose_sagas.parent, compose_sagas.invoicing],
        participants=[worker_in(compose_sagas.CONTEXT), worker_in("billing")],
    )
    async with applied(private_redis_server, whole) as users:
        compose = Partition(compose_sagas.CONTEXT, 0)
        orchestrator = SagaWorker(
            users.client("redsaga.compose"),
            App("compose", sagas=[compose_sagas.parent]),
            config=users.config("orchestrator:compose"),
        )
        client = SagaClient(users.client("redsaga.client"), whole.registry, config=users.config("client:web"))
        await client.start(compose_sagas.parent, compose_sagas.Plan(id="p1"), saga_id="p1", wait_s=0)
        await orchestrator.run_until_idle()
        # the billing orchestrator's stolen Redis user and keyring (it reports children's ends there)
        child = SagaClient(
            users.client("redsaga.billing"), whole.registry, config=users.config("orchestrator:billing")
        )
        assert child.principal == "orchestrator:billing"
        parent = ParentLink(
            context="billing",
            partition=0,
            saga_id="i1",
            saga="invoicing@1",
            step="s",
            attempt=1,
            command_id="c",
        )
        # the start request as the stolen user writes it (a client would first read the saga's
        # hash to judge an existing id, which this user may not: the attacker skips that read)
        request = StartRequest(
            saga=compose_sagas.parent.key,
            data=msgspec.Raw(msgspec.json.encode(compose_sagas.Plan(id="p2"))),
            by="mallory",
            parent=parent if link else None,
        )
        start = Envelope(
            id=bus.uuid7(), type=START, correlation_id="p2", payload=msgspec.json.encode(request)
        )
        started = users.auth("orchestrator:billing").sign(
            start, "orchestrator:compose", "orchestrator:billing"
        )
        await users.client("redsaga.billing").xadd(compose.inbox.key, started.to_fields())  # type: ignore[arg-type]
        cancel = Envelope(
            id=bus.uuid7(), type=CANCEL, correlation_id="p1",
            payload=msgspec.json.encode(OperatorRequest(by="mallory", reason="stolen keyring")),
        )  # fmt: skip
        signed = users.auth("orchestrator:billing").sign(
            cancel, "orchestrator:compose", "orchestrator:billing"
        )
        await users.client("redsaga.billing").xadd(compose.inbox.key, signed.to_fields())  # type: ignore[arg-type]
        await orchestrator.run_until_idle()
        assert (await client.get("p1", context=compose_sagas.CONTEXT)).status == SagaStatus.RUNNING
        assert not await users.admin.exists(compose.saga("p2"))
        letters = await dead_letters(users.admin, compose.inbox)
        reasons = [letter["reason"] for letter in letters]
        assert len(reasons) == 2
        assert all("signed by orchestrator:billing, which may not send it" in r for r in reasons), reasons
