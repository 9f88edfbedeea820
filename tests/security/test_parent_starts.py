"""A parent context may start only the child definitions its sagas run.

An orchestrator whose sagas run children in another context may write that context's inbox
(its children's starts) and sign for it. With its keyring and Redis user stolen, the only
starts it may make there are of the definitions its own sagas run as children: known from
the parent's definitions where the child context's workers hold them, else from the child
definition's ``parents=``. These run on a real ``redis-server`` with every process its own
ACL user and keyring.
"""

from __future__ import annotations

import msgspec
import pytest
from structlog.testing import capture_logs

import bus
from bus import Envelope
from saga import App, Command, Saga, SagaWorker
from saga.core.model import ParentLink, Started
from saga.definition.registry import Registry
from saga.errors import DefinitionError
from saga.runtime.protocol import START, StartRequest
from saga.store.keys import Partition
from saga.store.trust import allowed_senders
from tests.faults.servers import PrivateRedis
from tests.helpers import dead_letters
from tests.saga import compose_sagas
from tests.saga.compose_sagas import Plan, Worked, work
from tests.security.acl_users import Users, applied
from tests.security.test_acl import worker_in

pytestmark = [pytest.mark.anyio]

BILLING = Partition("billing", 0)


def _billing_saga(name: str, parents: tuple[str, ...] = ()) -> Saga[Plan]:
    definition: Saga[Plan] = Saga(name, context="billing", data=Plan, parents=parents)

    @definition.step(reply=Worked, name="pay")
    def pay(data: Plan) -> Command:
        return work("pay", data)

    return definition


payout = _billing_saga("payout", parents=("shop",))  # declares another parent
refund = _billing_saga("refund")  # declares nothing
invoicing = _billing_saga("invoicing_declared", parents=(compose_sagas.CONTEXT,))


def _start(definition: Saga[Plan], saga_id: str) -> Started:
    link = ParentLink(
        context=compose_sagas.CONTEXT, partition=0, saga_id="p1", saga="parent@1", step="bill", attempt=1,
        command_id="c1",
    )  # fmt: skip
    data = msgspec.Raw(msgspec.json.encode(Plan(id=saga_id)))
    return Started(id=saga_id, at_ms=0, saga=definition.key, data=data, parent=link)


# -- the rule ----------------------------------------------------------------------------------


def test_the_parents_code_says_which_children_it_starts() -> None:
    both = Registry([compose_sagas.parent, compose_sagas.invoicing, refund])
    assert both.may_start_child(compose_sagas.CONTEXT, compose_sagas.invoicing) is True
    assert both.may_start_child(compose_sagas.CONTEXT, refund) is False  # compose runs no refund
    apart = Registry([compose_sagas.invoicing, refund, payout, invoicing])
    assert apart.may_start_child(compose_sagas.CONTEXT, refund) is None  # nothing known
    assert apart.may_start_child(compose_sagas.CONTEXT, invoicing) is True  # declared
    assert apart.may_start_child(compose_sagas.CONTEXT, payout) is False  # declares another
    assert apart.may_start_child("shop", payout) is True


def test_a_parent_orchestrator_may_start_only_what_it_may_start_as_a_child() -> None:
    started = _start(refund, "r1")
    parent = f"orchestrator:{compose_sagas.CONTEXT}"
    assert parent in (allowed_senders("billing", refund, None, started, parent_starts=True) or set())
    assert parent in (allowed_senders("billing", refund, None, started, parent_starts=None) or set())
    refused = allowed_senders("billing", refund, None, started, parent_starts=False) or set()
    assert parent not in refused
    assert {"client:*", "operator:*", "orchestrator:billing"} <= refused  # the others keep theirs


def test_a_declared_parent_is_a_context_name() -> None:
    with pytest.raises(DefinitionError, match="invalid context name"):
        Saga("x", context="billing", data=Plan, parents=("rs:{evil}",))


# -- on a real server, with the parent's stolen credentials -----------------------------------


async def _start_as_stolen_parent(users: Users, definition: Saga[Plan], saga_id: str) -> None:
    """What the ``compose`` orchestrator's stolen Redis user and keyring write to billing's inbox."""
    started = _start(definition, saga_id)
    request = StartRequest(saga=definition.key, data=started.data, by="mallory", parent=started.parent)
    payload = msgspec.json.encode(request)
    envelope = Envelope(id=bus.uuid7(), type=START, correlation_id=saga_id, payload=payload)
    signer = f"orchestrator:{compose_sagas.CONTEXT}"
    signed = users.auth(signer).sign(envelope, "orchestrator:billing", signer)
    await users.client(f"redsaga.{compose_sagas.CONTEXT}").xadd(BILLING.inbox.key, signed.to_fields())  # type: ignore[arg-type]


@pytest.mark.redis
async def test_a_stolen_parent_keyring_starts_no_child_definition_the_parent_does_not_run(
    private_redis_server: PrivateRedis,
) -> None:
    whole = App(
        "all",
        sagas=[compose_sagas.parent, compose_sagas.invoicing, payout, refund, invoicing],
        participants=[worker_in(compose_sagas.CONTEXT), worker_in("billing")],
    )
    async with applied(private_redis_server, whole) as users:
        # billing deployed apart: its workers hold its own definitions, not compose's
        billing = SagaWorker(
            users.client("redsaga.billing"),
            App("billing", sagas=[compose_sagas.invoicing, payout, refund, invoicing]),
            config=users.config("orchestrator:billing"),
        )
        await _start_as_stolen_parent(users, payout, "x1")  # payout names another parent
        await _start_as_stolen_parent(users, invoicing, "x2")  # names compose: a real child start
        with capture_logs() as logs:
            await _start_as_stolen_parent(users, refund, "x3")  # names nobody: taken, and said
            await _start_as_stolen_parent(users, refund, "x4")
            await billing.run_until_idle()
        assert not await users.admin.exists(BILLING.saga("x1"))
        assert await users.admin.exists(BILLING.saga("x2"))
        assert await users.admin.exists(BILLING.saga("x3"))
        [letter] = await dead_letters(users.admin, BILLING.inbox)
        assert "signed by orchestrator:compose, which may not send it" in letter["reason"]
        assert "no saga of context 'compose' runs payout as a child here" in letter["reason"]
        said = [log for log in logs if log["event"].startswith("a child start accepted without a record")]
        assert len(said) == 1  # once per parent and definition
        assert said[0]["saga"] == "refund"
        assert "parents=['compose']" in said[0]["fix"]
