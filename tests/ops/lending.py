"""The waiting loan saga of the durable-time tests, as a system the operations tests drive.

``app`` holds the definitions (what ``saga --app tests.ops.lending:app`` loads);
:class:`Lending` adds the ledger and mailer participants, a worker on a fake clock set at
noon, a client and an admin client, and drives a loan to the wait it should be suspended at.
The context's signal secret is the one the engine keeps in Redis, so the command line finds
it too.
"""

from __future__ import annotations

import anyio

import bus
from bus import FakeClock, Publisher
from saga import App, EngineConfig, SagaAdmin, SagaClient, SagaWorker
from tests.saga.time_sagas import NOON, TREASURY_EVENTS, Approval, FundsReady, Loan, loan, participants, trip

app = App("lending", sagas=[loan, trip])
APP_REF = "tests.ops.lending:app"
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))
LOAN = Loan(id="L1", amount=500)
YES = Approval(approved=True, by="ann")


class Lending:
    """A loan in Redis, with the participants and a worker deciding on a fake clock."""

    def __init__(self, redis: bus.Redis) -> None:
        self.redis = redis
        self.clock = FakeClock(int(NOON.timestamp() * 1000))
        self.effects: list[tuple[str, str]] = []
        self.tokens: list[str] = []
        self.app = App("lending", sagas=[loan, trip], participants=participants(self.effects, self.tokens))
        self.worker = SagaWorker(redis, self.app, config=CONFIG, clock=self.clock, consumer="w1")
        self.client = SagaClient(redis, self.app.registry, clock=self.clock, config=CONFIG)
        self.admin = SagaAdmin(redis, app, clock=self.clock, config=CONFIG, by="alice@ops", wait_s=10)

    async def idle(self) -> None:
        with anyio.fail_after(30):
            await self.worker.run_until_idle()

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.idle()

    async def funds(self) -> None:
        """The treasury's event the loan waits for."""
        await Publisher(self.redis, source="treasury").publish(
            TREASURY_EVENTS, FundsReady(loan_id="L1", ref="w1")
        )
        await self.idle()

    async def suspended_at(self, step: str) -> str:
        """Start the loan and let it run to ``step`` (approval, cool_off or funds)."""
        await self.worker.bus_worker.setup()  # the event subscription exists before events come
        saga_id = await self.client.start(loan, LOAN, saga_id=LOAN.id)
        await self.idle()
        if step in ("cool_off", "funds"):
            await self.client.signal(self.tokens[0], YES)
            await self.idle()
        if step == "funds":
            await self.advance(3_600)
        state = await self.client.get(saga_id)
        assert state.wait is not None
        assert state.wait.step == step
        return saga_id
