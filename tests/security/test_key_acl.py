"""Concurrency keys under the generated ACL users and signing, on a private ``redis-server``.

The orchestrator's user takes and gives back its context's slots (one selector on the lines'
keys, the slot script alone); a participant's user cannot touch a line; a client's start
request that finds a singleton busy comes back as :class:`~saga.KeyBusy`.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest
import redis.exceptions

from saga import App, Key, KeyBusy, Saga, SagaClient, SagaNotFound, SagaStatus, SagaWorker
from saga.store.keys import Partition, SlotKeys
from tests.faults.servers import PrivateRedis
from tests.flow.key_sagas import LOG, Withdrawal, bank, ledger, withdrawal_saga
from tests.helpers import dead_letters
from tests.security.acl_users import Users, applied

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
ONE_AT_A_TIME = withdrawal_saga(Key(lambda d: d.account))
SINGLETON = withdrawal_saga(Key(lambda d: d.account, skip_if_running=True), name="singleton")
BY_TENANT = withdrawal_saga(Key(lambda d: d.account, fairness=lambda d: d.tenant), name="by_tenant")


@pytest.fixture(autouse=True)
def fresh_log() -> Iterator[None]:
    LOG.clear()
    yield
    LOG.clear()


def roles(users: Users, saga: Saga[Withdrawal]) -> tuple[SagaWorker, SagaWorker, SagaClient]:
    """The orchestrator, the ledger and the web client, each as its own user and principal."""
    orchestrator = SagaWorker(
        users.client("redsaga.bank"), bank(saga, with_ledger=False), config=users.config("orchestrator:bank")
    )
    participant = SagaWorker(
        users.client("redsaga.bank.ledger"), App("ledger", participants=[ledger]),
        config=users.config("participant:ledger"),
    )  # fmt: skip
    client = SagaClient(
        users.client("redsaga.client"), bank(saga).registry, config=users.config("client:web")
    )
    return orchestrator, participant, client


async def test_sagas_of_one_account_run_one_at_a_time_under_the_generated_users(
    private_redis_server: PrivateRedis,
) -> None:
    app = bank(ONE_AT_A_TIME)
    async with applied(private_redis_server, app) as users:
        orchestrator, participant, client = roles(users, ONE_AT_A_TIME)
        ids = [
            await client.start(ONE_AT_A_TIME, Withdrawal("acct-a"), saga_id=f"s{n}", wait_s=0)
            for n in range(3)
        ]
        for _ in range(20):
            await orchestrator.run_until_idle()
            await participant.run_until_idle()
        statuses = [(await client.get(i)).status for i in ids]
        assert statuses == [SagaStatus.COMPLETED] * 3
        assert [saga_id for saga_id, what in LOG if what == "debit"] == ids
        assert await users.denials() == []

        keys = SlotKeys("bank", "withdraw", "acct-a")
        thief = users.client("redsaga.bank.ledger")
        with pytest.raises(redis.exceptions.NoPermissionError):
            await thief.zadd(keys.holders, {"0:mine": 1})
        with pytest.raises(redis.exceptions.NoPermissionError):
            await users.client("redsaga.operator").zadd(keys.holders, {"0:mine": 1})
        assert await users.client("redsaga.operator").zcard(keys.holders) == 0  # it reads lines


async def test_a_start_request_finding_a_singleton_busy_is_refused_as_key_busy(
    private_redis_server: PrivateRedis,
) -> None:
    app = bank(SINGLETON)
    async with applied(private_redis_server, app) as users:
        orchestrator, _, client = roles(users, SINGLETON)
        await client.start(SINGLETON, Withdrawal("acct-a"), saga_id="first", wait_s=0)
        await orchestrator.run_until_idle()
        async with anyio.create_task_group() as workers:
            workers.start_soon(orchestrator.run)
            with pytest.raises(KeyBusy, match="has every slot taken"):
                await client.start(SINGLETON, Withdrawal("acct-a"), saga_id="second", wait_s=10)
            assert await client.start(SINGLETON, Withdrawal("acct-b"), saga_id="other", wait_s=10) == "other"
            workers.cancel_scope.cancel()
        assert await users.denials() == []


async def test_a_start_whose_key_cannot_be_read_is_refused_alone_and_its_round_goes_on(
    private_redis_server: PrivateRedis,
) -> None:
    """Bad input in one start request (a tenant no key may hold) refuses that start, with the
    reason in a dead letter, and never fails the other entries decided in the same round."""
    app = bank(BY_TENANT)
    async with applied(private_redis_server, app) as users:
        orchestrator, _, client = roles(users, BY_TENANT)
        await client.start(
            BY_TENANT, Withdrawal("acct-a", tenant="no spaces allowed"), saga_id="bad", wait_s=0
        )
        await client.start(BY_TENANT, Withdrawal("acct-a", tenant="acme"), saga_id="good", wait_s=0)
        await orchestrator.run_until_idle()
        assert (await client.get("good")).status == SagaStatus.RUNNING  # its debit was sent
        with pytest.raises(SagaNotFound):
            await client.get("bad")
        [letter] = await dead_letters(users.admin, Partition("bank", 0).inbox)
        assert "fairness key 'no spaces allowed'" in letter["reason"]
        assert await users.denials() == []
