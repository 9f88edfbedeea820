"""Signed entries end to end: each principal its own worker and keyring, on fakeredis and on
real Redis. Every forgery a stolen participant keyring (or no keyring) can make is
dead-lettered with its reason and changes nothing; what each principal may send goes through.
"""

from __future__ import annotations

import msgspec
import pytest

import bus
from bus import Envelope, derived_id
from redsaga.examples.contracts import Line, Order, StockReserved
from redsaga.examples.orders import order_fulfilment
from saga import App, InvalidToken, SagaError, SagaStatus
from saga.core.tokens import Signer
from saga.runtime.protocol import CANCEL, FORCE, SIGNAL, OperatorRequest, SignalDelivery
from saga.store.keys import Partition
from saga.testing import decode_history
from tests.helpers import dead_letters, envelope_items
from tests.saga.time_sagas import LENDING, Approval, Loan, loan, participants
from tests.security.signed_world import SignedWorld

pytestmark = pytest.mark.anyio
ORDER = Order(id="o-1", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=900)
PARTITION = Partition("orders", 0)


async def started(redis: bus.Redis, **options: object) -> SignedWorld:
    world = SignedWorld(redis, **options)  # type: ignore[arg-type]
    await world.client.start(order_fulfilment, ORDER, saga_id=ORDER.id, wait_s=0)
    return world


async def reasons(redis: bus.Redis, partition: Partition = PARTITION) -> list[str]:
    return [letter["reason"] for letter in await dead_letters(redis, partition.inbox)]


async def forge(
    world: SignedWorld, signer: str, kind: str, payload: bytes, saga_id: str, **fields: object
) -> None:
    """Put an entry of ``kind`` on the saga's inbox, signed with ``signer``'s stolen keyring."""
    envelope = Envelope(id=bus.uuid7(), type=kind, payload=payload, correlation_id=saga_id, **fields)  # type: ignore[arg-type]
    audience = f"orchestrator:{world.partition.context}"
    await world.attacker(signer).publish_envelope(world.partition.inbox, envelope, audience=audience)


async def test_the_order_system_runs_signed_every_principal_its_own_keyring(redis: bus.Redis) -> None:
    world = await started(redis)
    await world.settle()
    state = await world.client.get(ORDER.id)
    assert state.status == SagaStatus.COMPLETED
    assert state.steps["reserve_stock"].attempts[-1].participant == "inventory"
    assert not await reasons(redis)
    entries = [f for _, f in await redis.xrange(PARTITION.inbox.key)]
    assert entries
    items = [envelope_items(f) for f in entries]
    assert all(len(i["mac"]) == 16 and i["p"] for i in items), "every inbox entry is signed"
    signers = {i["p"] for i in items}
    assert signers == {"client:web", "participant:inventory", "participant:payments", "participant:shipping"}


async def test_a_client_without_the_orchestrator_keyring_starts_by_request_and_a_repeat_changes_nothing(
    redis: bus.Redis,
) -> None:
    world = await started(redis)
    assert not await redis.exists(PARTITION.saga(ORDER.id))  # only a request is written
    await world.client.start(order_fulfilment, ORDER, saga_id=ORDER.id, wait_s=0)
    other = msgspec.structs.replace(ORDER, total_cents=1)
    await world.client.start(order_fulfilment, other, saga_id=ORDER.id, wait_s=0)
    await world.settle()
    state = await world.client.get(ORDER.id)
    assert state.status == SagaStatus.COMPLETED
    assert msgspec.json.decode(bytes(state.data), type=Order) == ORDER
    [refused] = await reasons(redis)
    assert refused.endswith(
        "start request refused: saga 'o-1' exists and runs order_fulfilment@1 with other data"
    )
    [first, *_] = decode_history(await redis.lrange(PARTITION.history(ORDER.id), 0, -1), state=state)
    assert first.event.by == "client via client:web"  # type: ignore[union-attr]


async def test_a_reply_forged_by_another_participant_is_dead_lettered_and_changes_nothing(
    redis: bus.Redis,
) -> None:
    """payments (its keyring stolen) replies for inventory's step: the saga must not move."""
    world = await started(redis)
    await world.orchestrator.run_until_idle()  # the saga starts; reserve_stock goes to inventory
    state = await world.client.get(ORDER.id)
    command_id = state.steps["reserve_stock"].attempts[-1].command_id
    headers = {"saga": "order_fulfilment@1", "step": "reserve_stock", "kind": "do"}
    payload = msgspec.json.encode(StockReserved(reservation_id="none"))
    await forge(
        world,
        "participant:payments",
        "StockReserved",
        payload,
        ORDER.id,
        causation_id=command_id,
        headers=headers,
    )
    unsigned = Envelope(
        id=derived_id(command_id, "reply"), type="StockReserved", payload=payload, correlation_id=ORDER.id,
        causation_id=command_id, headers=headers,
    )  # fmt: skip
    await redis.xadd(PARTITION.inbox.key, dict(unsigned.to_fields()))
    await world.orchestrator.run_until_idle()
    assert (await world.client.get(ORDER.id)).steps["reserve_stock"] == state.steps["reserve_stock"]
    refused = "StockReserved for saga o-1 signed by participant:payments, which may not send it"
    assert sorted(await reasons(redis)) == [
        f"permanent failure: Unauthenticated: {refused} (only participant:inventory)",
        "unauthenticated entry: entry is not signed (no signer, key id or MAC)",
    ]
    await world.settle()  # inventory's real reply still completes the saga
    assert (await world.client.get(ORDER.id)).status == SagaStatus.COMPLETED


@pytest.mark.parametrize(
    ("kind", "request_"),
    [
        (CANCEL, OperatorRequest(by="an operator", reason="forged")),
        (
            FORCE,
            OperatorRequest(
                by="an operator", reason="forged", step="reserve_stock", output=msgspec.Raw(b"{}")
            ),
        ),
    ],
    ids=["cancel", "force-complete"],
)
async def test_operator_messages_from_a_participant_are_dead_lettered(
    redis: bus.Redis, kind: str, request_: OperatorRequest
) -> None:
    world = await started(redis)
    await world.orchestrator.run_until_idle()
    before = await world.client.get(ORDER.id)
    envelope = Envelope(
        id=bus.uuid7(), type=kind, payload=msgspec.json.encode(request_), correlation_id=ORDER.id
    )
    await world.attacker("participant:payments").publish_envelope(
        PARTITION.inbox, envelope, audience="orchestrator:orders"
    )
    await world.orchestrator.run_until_idle()
    after = await world.client.get(ORDER.id)
    assert (after.status, after.revision) == (before.status, before.revision)
    [reason] = await reasons(redis)
    assert f"{kind} for saga o-1 signed by participant:payments, which may not send it" in reason


async def test_the_history_credits_whoever_signed_an_action(redis: bus.Redis) -> None:
    world = await started(redis)
    await world.orchestrator.run_until_idle()
    await world.client.cancel(ORDER.id, reason="customer asked", by="alice")
    await world.settle()
    state = await world.client.get(ORDER.id)
    assert state.status in (SagaStatus.CANCELLED, SagaStatus.COMPENSATED)
    assert state.cancel is not None
    assert state.cancel.by == "alice via client:web"


async def test_in_log_mode_a_forgery_is_reported_and_goes_through(redis: bus.Redis) -> None:
    """The rollout step: every check runs, nothing is refused; the incidents count them."""
    world = await started(redis, mode="log")
    await world.orchestrator.run_until_idle()
    await redis.xadd(
        PARTITION.inbox.key,
        dict(Envelope(id=bus.uuid7(), type=CANCEL, payload=b"{}", correlation_id=ORDER.id).to_fields()),
    )
    await world.settle()
    assert (await world.client.get(ORDER.id)).cancel is not None
    assert world.orchestrator.bus_worker.incidents["unauthenticated"] == 1
    assert not await reasons(redis)


# -- signals and tokens -----------------------------------------------------------------------

LOANS = Partition(LENDING, 0)
APPROVED = msgspec.Raw(b'{"approved":true,"by":"mallory"}')


async def waiting_loan(redis: bus.Redis, tokens: list[str]) -> SignedWorld:
    app = App("lending", sagas=[loan], participants=participants([], tokens))
    world = SignedWorld(redis, app=app)
    await world.client.start(loan, Loan(id="L1", amount=500), saga_id="L1", wait_s=0)
    await world.settle()
    return world


async def test_a_signal_needs_its_token_checked_by_the_orchestrator_on_arrival(redis: bus.Redis) -> None:
    tokens: list[str] = []
    world = await waiting_loan(redis, tokens)
    assert (await world.client.get("L1")).status == SagaStatus.SUSPENDED
    delivery = SignalDelivery(step="approval", n=1, data=msgspec.Raw(b'{"approved":true,"by":"x"}'))
    envelope = Envelope(
        id=bus.uuid7(), type=SIGNAL, payload=msgspec.json.encode(delivery), correlation_id="L1"
    )
    await world.attacker("client:web").publish_envelope(
        LOANS.inbox, envelope, audience="orchestrator:lending"
    )
    await world.settle()
    assert (await world.client.get("L1")).status == SagaStatus.SUSPENDED
    [reason] = await reasons(redis, LOANS)
    assert "signal refused: resume token is malformed" in reason
    await world.client.signal(tokens[0], Approval(approved=True, by="ann"))
    await world.settle()
    assert (await world.client.get("L1")).wait.step == "cool_off"  # type: ignore[union-attr]


async def test_clients_check_tokens_with_public_keys_and_cannot_make_them(redis: bus.Redis) -> None:
    tokens: list[str] = []
    world = await waiting_loan(redis, tokens)
    assert not world.client.can_make_tokens(LENDING)
    with pytest.raises(SagaError, match="only its orchestrator can"):
        await world.client.signer(LENDING)
    assert (await world.client.query("L1")).wait.token is None  # type: ignore[union-attr]
    assert (await world.client.verifier(LENDING)).verify(tokens[0]).saga_id == "L1"
    assert not await redis.exists(f"rs:{{{LENDING}:meta}}:signal-secret"), "no secret is kept in Redis"


async def test_a_token_of_an_earlier_saga_under_the_same_id_is_refused(redis: bus.Redis) -> None:
    tokens: list[str] = []
    world = await waiting_loan(redis, tokens)
    state = await world.client.get("L1")
    signer = Signer.from_auth(world.auth("orchestrator:lending"), LENDING)
    assert signer is not None
    earlier = signer.token(0, "L1", "approval", 1, incarnation=state.created_ms - 1, now_ms=0)
    with pytest.raises(InvalidToken, match="earlier saga under the same id"):
        await world.client.signal(earlier, Approval(approved=True, by="mallory"))
    delivery = SignalDelivery(
        step="approval", n=1, data=msgspec.Raw(b'{"approved":true,"by":"m"}'), token=earlier
    )
    envelope = Envelope(
        id=bus.uuid7(), type=SIGNAL, payload=msgspec.json.encode(delivery), correlation_id="L1"
    )
    await world.attacker("client:web").publish_envelope(
        LOANS.inbox, envelope, audience="orchestrator:lending"
    )
    await world.settle()
    assert (await world.client.get("L1")).status == SagaStatus.SUSPENDED
    [reason] = await reasons(redis, LOANS)
    assert "earlier saga under the same id" in reason


# -- payloads ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"not json at all", "is not a valid JSON value"),
        (b'{"r":' + b"[" * 5000 + b"]" * 5000 + b"}", "too deeply"),
    ],
    ids=["not-json", "deeply-nested"],
)
async def test_a_bad_payload_is_dead_lettered_on_first_delivery_and_the_saga_stays_readable(
    redis: bus.Redis, payload: bytes, why: str
) -> None:
    """An undo reply's payload was stored unchecked; any reply's now goes through its type."""
    world = await started(redis)
    await world.orchestrator.run_until_idle()
    state = await world.client.get(ORDER.id)
    command_id = state.steps["reserve_stock"].attempts[-1].command_id
    undo = {"step": "reserve_stock", "kind": "undo", "inc": str(state.created_ms)}
    await forge(
        world,
        "participant:inventory",
        "StockReleased",
        payload,
        ORDER.id,
        causation_id=command_id,
        headers=undo,
    )
    await world.orchestrator.run_until_idle()
    letters = await dead_letters(redis, PARTITION.inbox)
    assert len(letters) == 1
    assert why in letters[0]["reason"]
    assert letters[0]["deliveries"] == "1"
    assert (await world.client.get(ORDER.id)).revision == state.revision
