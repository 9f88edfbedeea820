"""What the stream and bad-input fault tests share: the order saga on real Redis, driven by
``run_until_idle`` and a fake clock (no real time passes), with participants that count
their effects and one that can be held mid-handler.

The saga is ``redsaga.examples.orders.order_fulfilment`` (reserve stock -> charge ->
ship, 30 s step timeouts, retries): a lost command or reply ends in a step timeout, which
its retry policy re-dispatches.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import anyio

import bus
from bus import Bus, FakeClock, Stream
from redsaga.examples.contracts import (
    ORDERS,
    Line,
    Order,
    ReleaseStock,
    ReserveStock,
    StockReleased,
    StockReserved,
)
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import payments, shipping
from saga import App, CommandContext, EngineConfig, Participant, SagaClient, SagaState, SagaWorker
from saga.store.keys import Partition

PARTITION = Partition(ORDERS.name, 0)
INBOX = PARTITION.inbox
INVENTORY = PARTITION.commands("inventory")
ORCHESTRATOR = "orchestrator"
PARTICIPANTS = ("inventory", "payments", "shipping")
STEP_TIMEOUT_S = 30
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))


def order(n: int) -> Order:
    """A valid order whose every step succeeds."""
    return Order(id=f"o{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=100)


@dataclass
class Inventory:
    """An inventory participant that records its calls and effects per idempotency key.

    ``effects`` is what a real participant keeps with its key in one transaction: a call
    with a key already applied changes nothing (G2 is checked on it); ``calls`` counts every
    run of the handler. While ``gate`` is set, a handler waits on it (a handler in flight).
    """

    calls: Counter[str] = field(default_factory=Counter)
    effects: dict[str, str] = field(default_factory=dict)
    gate: anyio.Event | None = None
    held: anyio.Event = field(default_factory=anyio.Event)

    def participant(self) -> Participant:
        """The participant: reserve (held while ``gate`` is set) and release."""
        inventory = Participant("inventory", serves=[ORDERS])

        @inventory.handles(ReserveStock)
        async def reserve(command: ReserveStock, ctx: CommandContext) -> StockReserved:
            self.calls[ctx.idempotency_key] += 1
            self.effects.setdefault(ctx.idempotency_key, command.order_id)
            if self.gate is not None:
                self.held.set()
                await self.gate.wait()
            return StockReserved(reservation_id=f"r-{command.order_id}")

        @inventory.handles(ReleaseStock)
        async def release(command: ReleaseStock, ctx: CommandContext) -> StockReleased:
            self.calls[ctx.idempotency_key] += 1
            self.effects.setdefault(ctx.idempotency_key, command.reservation_id)
            return StockReleased(reservation_id=command.reservation_id)

        return inventory


@dataclass
class Rig:
    """The orders orchestrator and its participants on one Redis database, on a fake clock.

    They run as two workers (as in production: participants are other services), so a
    test can let the participants reply while the orchestrator is not running.
    """

    redis: bus.Redis
    orchestrator: SagaWorker
    participants: bus.Worker
    client: SagaClient
    clock: FakeClock
    inventory: Inventory

    @classmethod
    async def create(cls, redis: bus.Redis, config: EngineConfig = CONFIG) -> Rig:
        """Build the rig and create every consumer group."""
        clock = FakeClock()
        inventory = Inventory()
        app = App("orders", sagas=[order_fulfilment])
        services = Bus("services")
        for participant in (inventory.participant(), payments, shipping):
            participant.install(services)
        orchestrator = SagaWorker(redis, app, config=config, clock=clock)
        participants = bus.Worker(redis, services, config=config.bus, clock=clock)
        await orchestrator.bus_worker.setup()
        await participants.setup()
        client = SagaClient(redis, app.registry, clock=clock, config=config)
        return cls(redis, orchestrator, participants, client, clock, inventory)

    async def run(self) -> None:
        """Handle everything due now (entries, reclaims, timers) until a pass adds nothing."""
        streams = [INBOX.key, *(PARTITION.commands(p).key for p in PARTICIPANTS)]
        for _ in range(50):
            before = [await self.redis.xlen(key) for key in streams]
            await self.participants.run_until_idle()
            await self.orchestrator.run_until_idle()
            if [await self.redis.xlen(key) for key in streams] == before:
                return
        raise AssertionError("the saga traffic did not settle")

    async def time_out_and_retry(self) -> None:
        """Let a step's 30 s timeout fire, then its retry's back-off pass (virtual time only)."""
        self.clock.advance(STEP_TIMEOUT_S + 1)
        await self.run()
        self.clock.advance(1)
        await self.run()

    async def state(self, saga_id: str) -> SagaState:
        """The saga as stored."""
        return await self.client.get(saga_id)

    async def history(self, saga_id: str) -> list[bytes]:
        """The saga's history entries (JSON), oldest first."""
        return list(await self.redis.lrange(PARTITION.history(saga_id), 0, -1))

    def incidents(self) -> Counter[str]:
        """Both workers' incident counters, summed."""
        return self.orchestrator.bus_worker.incidents + self.participants.incidents

    async def pending(self) -> int:
        """Entries pending in every group of the partition's streams (G7, G8: 0 at rest)."""
        total = 0
        for stream in [INBOX, *(PARTITION.commands(p) for p in PARTICIPANTS)]:
            for group in await self.redis.xinfo_groups(stream.key):
                total += int(group["pending"])
        return total


async def read_as(redis: bus.Redis, stream: Stream, group: str, consumer: str) -> list[str]:
    """Read every new entry of ``group`` as ``consumer`` (a worker that then dies)."""
    reply = await redis.xreadgroup(group, consumer, {stream.key: ">"})
    return [entry_id.decode() for _, entries in reply or () for entry_id, _ in entries]


async def letters(redis: bus.Redis) -> list[dict[str, str]]:
    """Every dead letter of the orders partition (one dead-letter stream per hash tag)."""
    from tests.helpers import dead_letters

    return await dead_letters(redis, INBOX)
