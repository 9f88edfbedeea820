"""Secrets never reach the logs: neither the resume-token secret nor a Redis password."""

from __future__ import annotations

import contextlib

import anyio
import pytest
from structlog.testing import capture_logs

import bus
from saga import App, EngineConfig, SagaClient, SagaStatus, SagaWorker
from saga.errors import WaitEnded
from saga.store.token_keys import secret_key
from tests.faults.servers import PrivateRedis
from tests.helpers import eventually
from tests.saga import time_sagas
from tests.security.acl_users import applied

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
LENDING = time_sagas.LENDING


async def ended(client: SagaClient, saga_id: str) -> bool:
    return (await client.get(saga_id)).status.terminal


async def test_a_signalled_saga_logs_neither_the_signal_secret_nor_the_redis_password(
    private_redis_server: PrivateRedis,
) -> None:
    effects: list[tuple[str, str]] = []
    tokens: list[str] = []
    ledger, mailer = time_sagas.participants(effects, tokens)
    whole = App("lending", sagas=[time_sagas.loan], participants=[ledger, mailer])
    roles = {
        f"redsaga.{LENDING}": App("orchestrator", sagas=[time_sagas.loan]),
        f"redsaga.{LENDING}.ledger": App("ledger", participants=[ledger]),
        f"redsaga.{LENDING}.mailer": App("mailer", participants=[mailer]),
    }
    async with applied(private_redis_server, whole) as users:
        with capture_logs() as logs:
            workers = [SagaWorker(users.client(name), app) for name, app in roles.items()]
            orchestrator = users.client(f"redsaga.{LENDING}")
            async with anyio.create_task_group() as tg:
                for worker in workers:
                    tg.start_soon(worker.run)
                loans = SagaClient(orchestrator, whole.registry)
                past = "2000-01-01T00:00:00+00:00"
                await loans.start(
                    time_sagas.loan, time_sagas.Loan(id="l1", amount=5, sleep_until=past), saga_id="l1"
                )
                await eventually(lambda: bool(tokens), 30, "the loan waits for its signal")
                await loans.signal(tokens[0], time_sagas.Approval(approved=True, by="ops"))
                # a repeat: sent and ignored while the orchestrator has not taken the first yet,
                # refused by the client once it has; neither may log the secret
                with contextlib.suppress(WaitEnded):
                    await loans.signal(tokens[0], time_sagas.Approval(approved=True, by="ops"))
                funds = time_sagas.FundsReady(loan_id="l1", ref="r1")
                await bus.Publisher(users.admin).publish(bus.Stream.named(time_sagas.TREASURY_EVENTS), funds)
                await eventually(lambda: ended(loans, "l1"), 30, "the loan ended")
                for worker in workers:
                    worker.stop()
            # a process with a wrong password is refused; its error names no password either
            wrong = bus.connect(
                private_redis_server.url.replace("redis://", "redis://redsaga.lending:nope-7f3a@")
            )
            with pytest.raises(bus.BusError) as refused:
                await SagaClient(wrong, whole.registry).get("l1")
            await wrong.aclose()
        generated = (await users.admin.get(secret_key(LENDING))).decode()
        assert (await loans.get("l1")).status == SagaStatus.COMPLETED
    secrets = [generated, *(f"pw-{name}" for name in users.users), "nope-7f3a"]
    text = "\n".join(repr(entry) for entry in logs) + repr(refused.value) + repr(orchestrator)
    assert [s for s in secrets if s in text] == []
    assert len(logs) > 5  # the run did log (at every level): the check above saw real lines


def test_a_configured_signal_secret_is_not_in_the_configs_repr() -> None:
    config = EngineConfig(signal_secret="a secret of sixteen bytes or more")
    assert "sixteen" not in repr(config)
