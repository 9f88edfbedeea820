"""The example order system with every principal its own process and its own keyring.

Each principal runs in its own :class:`~saga.SagaWorker` (or client) with an
:class:`~bus.Authenticator` that holds only its own keyring, issued from one master as
``saga keys issue`` does; workers are stepped with ``run_until_idle`` on a fake clock.
``attacker(principal)`` is a publisher holding a stolen keyring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import bus
from bus import Authenticator, FakeClock, Publisher
from bus._auth import Mode
from redsaga.examples import stateless
from redsaga.examples.orders import order_fulfilment
from saga import App, EngineConfig, SagaClient, SagaWorker
from saga.ops.keyrings import MasterFile, issue_keyrings, new_master, reach_of
from saga.store.keys import Partition

ORDERS = App(
    "orders",
    sagas=[order_fulfilment],
    participants=[stateless.payments, stateless.inventory, stateless.shipping],
)
PARTITION = Partition("orders", 0)


@dataclass
class SignedWorld:
    """An app's orchestrator, each participant and a client, each signing as itself only."""

    redis: bus.Redis
    app: App = ORDERS
    mode: Mode = "require"
    clock: FakeClock = field(default_factory=lambda: FakeClock(1_800_000_000_000))
    master: MasterFile = field(default_factory=new_master)

    def __post_init__(self) -> None:
        self.reach = reach_of(self.app, clients=["web"], operators=["oncall"])
        [context] = self.app.registry.contexts
        self.partition = Partition(context, 0)
        sagas = App(context, sagas=list(self.app.registry))
        self.orchestrator = self._worker(f"orchestrator:{context}", sagas)
        self.participants = [
            self._worker(f"participant:{p.name}", App(p.name, participants=[p]))
            for p in self.app.participants
        ]
        self.client = SagaClient(
            self.redis, self.app.registry, clock=self.clock, config=self.config("client:web")
        )

    def auth(self, principal: str) -> Authenticator:
        """An authenticator holding ``principal``'s keyring only."""
        return Authenticator(issue_keyrings(self.master, self.reach, [principal]), self.mode)

    def config(self, principal: str) -> EngineConfig:
        """An engine config that signs as ``principal``."""
        return EngineConfig(bus=bus.BusConfig(lease_ms=10_000), auth=self.auth(principal))

    def _worker(self, principal: str, app: App) -> SagaWorker:
        return SagaWorker(
            self.redis, app, config=self.config(principal), clock=self.clock, consumer=principal
        )

    def attacker(self, principal: str) -> Publisher:
        """A publisher with ``principal``'s stolen keyring (it signs as that principal)."""
        return Publisher(self.redis, source="attacker", auth=self.auth(principal), principal=principal)

    async def settle(self, rounds: int = 12) -> None:
        """Step every worker until nothing is left to do (a saga crosses all of them)."""
        workers = [self.orchestrator, *self.participants]
        for _ in range(rounds):
            before = await self._activity()
            for worker in workers:
                await worker.run_until_idle()
            if await self._activity() == before:
                return
        raise AssertionError(f"the system was still busy after {rounds} rounds")

    async def _activity(self) -> tuple[int, ...]:
        keys = [
            self.partition.inbox.key,
            *(self.partition.commands(p.name).key for p in self.app.participants),
        ]
        return tuple([int(await self.redis.xlen(k)) for k in keys])
