"""One table of order-fulfilment scenarios, run on the in-process runner and on Redis.

Each scenario runs the example saga (``redsaga.examples.orders``) against fresh
participants built from the same code for every backend, with faults driven by the order
(declined card, unserved region, flaky participants) and by per-scenario knobs (a refund
service that is down, a release that is flaky, a fraud check that cancels mid-flight, a
shipping service that is down for a while). The same script runs on:

- the in-process runner (``saga.testing.SagaRunner``), and
- Redis through ``SagaWorker.run_until_idle()`` with a ``FakeClock`` -- on fakeredis, on a
  6-node Redis Cluster (marker ``cluster``) and on
  real Redis (the ``redis`` fixture) -- one worker for the orchestrator and one per
  participant, so a participant can be "down" by not being run.

Both must end in the same status with the same step records (statuses, attempt outcomes,
completion and compensation order); the Redis history must replay exactly through the
decider and satisfy the same invariants; and every participant effect happens once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import msgspec
import pytest

import bus
from bus import FakeClock, PermanentError, TransientError, derived_id
from redsaga.examples.contracts import (
    ORDERS,
    ArrangeShipping,
    CardCharged,
    CardRefunded,
    ChargeCard,
    Line,
    Order,
    RefundCard,
    ReleaseStock,
    ReserveStock,
    ShipmentArranged,
    StockReleased,
    StockReserved,
)
from redsaga.examples.orders import RETRY, order_fulfilment
from saga import (
    App,
    Command,
    CommandContext,
    Participant,
    Saga,
    SagaClient,
    SagaState,
    SagaStatus,
    SagaWorker,
    StepContext,
    command,
)
from saga.runtime.protocol import FORCE, OperatorRequest
from saga.runtime.protocol import RETRY as RETRY_REQUEST
from saga.store.keys import Partition
from saga.testing import SagaRunner, Summary, decode_history, invariant_violations, replay, summarize

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]

Cancel = Callable[[str], Awaitable[None]]
Op = tuple[str, ...]
"""A script step: ("settle",) ("advance", seconds) ("pause", name) ("resume", name)
("retry",) ("cancel",)."""


@dataclass(frozen=True)
class Knobs:
    """Faults the order itself cannot express."""

    refund: Literal["ok", "down"] = "ok"
    release_flaky: int = 0
    cancel_on_charge: bool = False


@dataclass
class Services:
    """Fresh example participants (the demo's logic) that log every effect they apply."""

    knobs: Knobs
    cancel: Cancel
    effects: list[tuple[str, str, str]] = field(default_factory=list)
    attempts: Counter[str] = field(default_factory=Counter)

    def build(self) -> list[Participant]:
        inventory = Participant("inventory", serves=[ORDERS])
        payments = Participant("payments", serves=[ORDERS])
        shipping = Participant("shipping", serves=[ORDERS])

        @inventory.handles(ReserveStock)
        async def reserve(command: ReserveStock, ctx: CommandContext) -> StockReserved:
            self.flaky(ctx, command.flaky)
            return self.done(ctx, StockReserved(reservation_id=derived_id(ctx.idempotency_key, "r")))

        @inventory.handles(ReleaseStock)
        async def release(command: ReleaseStock, ctx: CommandContext) -> StockReleased:
            self.flaky(ctx, self.knobs.release_flaky)
            return self.done(ctx, StockReleased(reservation_id=command.reservation_id))

        @payments.handles(ChargeCard)
        async def charge(command: ChargeCard, ctx: CommandContext) -> CardCharged:
            self.flaky(ctx, command.flaky)
            if self.knobs.cancel_on_charge:
                await self.cancel(ctx.saga_id)  # a fraud check asks to cancel, then answers
            if command.card == "declined":
                raise PermanentError("card declined")
            charge_id = derived_id(ctx.idempotency_key, "c")
            return self.done(ctx, CardCharged(charge_id=charge_id, amount_cents=command.amount_cents))

        @payments.handles(RefundCard)
        async def refund(_command: RefundCard, ctx: CommandContext) -> CardRefunded:
            if self.knobs.refund == "down":
                raise PermanentError("refunds are disabled for this merchant")
            return self.done(ctx, CardRefunded(refund_id=derived_id(ctx.idempotency_key, "f")))

        @shipping.handles(ArrangeShipping)
        async def arrange(command: ArrangeShipping, ctx: CommandContext) -> ShipmentArranged:
            self.flaky(ctx, command.flaky)
            if command.region == "nowhere":
                raise PermanentError("no carrier")
            return self.done(ctx, ShipmentArranged(tracking=derived_id(ctx.idempotency_key, "t")[:13]))

        return [inventory, payments, shipping]

    def flaky(self, ctx: CommandContext, times: int) -> None:
        self.attempts[ctx.idempotency_key] += 1
        if self.attempts[ctx.idempotency_key] <= times:
            raise TransientError(f"attempt {self.attempts[ctx.idempotency_key]} of {ctx.step} failed")

    def done(self, ctx: CommandContext, reply: Any) -> Any:
        self.effects.append((ctx.saga_id, ctx.step, ctx.kind))
        return reply


class Wrapped(msgspec.Struct, frozen=True):
    """The local action's output."""

    paper: str


gift_order: Saga[Order] = Saga("gift_order", version=1, context=ORDERS, data=Order)
"""Like order fulfilment, with a local action (and a local compensation) between the steps."""


@gift_order.step(reply=StockReserved, compensate="release_stock", retry=RETRY, timeout=30)
def reserve_stock(data: Order) -> Command:
    return command("inventory", ReserveStock(order_id=data.id, lines=data.lines, flaky=data.flaky))


@gift_order.action(compensate="unwrap", retry=RETRY)
async def wrap(data: Order, ctx: StepContext) -> Wrapped:
    if ctx.attempt <= data.flaky:
        raise TransientError("out of ribbon")
    return Wrapped(paper=f"paper-for-{ctx.output(reserve_stock).reservation_id[:8]}")


@gift_order.step(reply=CardCharged, compensate="refund_payment", retry=RETRY, timeout=30)
def charge_payment(data: Order) -> Command:
    return command(
        "payments",
        ChargeCard(
            order_id=data.id,
            customer=data.customer,
            amount_cents=data.total_cents,
            card=data.card,
            flaky=data.flaky,
        ),
    )


@gift_order.step(reply=ShipmentArranged, retry=RETRY, timeout=30)
def arrange_shipping(data: Order) -> Command:
    return command("shipping", ArrangeShipping(order_id=data.id, region=data.region, flaky=data.flaky))


@gift_order.compensation()
def release_stock(_data: Order, ctx: StepContext) -> Command:
    return command("inventory", ReleaseStock(reservation_id=ctx.output(reserve_stock).reservation_id))


@gift_order.compensation()
async def unwrap(_data: Order, ctx: StepContext) -> None:
    assert ctx.output(wrap).paper.startswith("paper-for-")


@gift_order.compensation()
def refund_payment(_data: Order, ctx: StepContext) -> Command:
    charge = ctx.output(charge_payment)
    return command("payments", RefundCard(charge_id=charge.charge_id, amount_cents=charge.amount_cents))


DEFINITIONS = [order_fulfilment, gift_order]
FORCED_OUTPUTS = {"arrange_shipping": ShipmentArranged(tracking="by-hand")}


@dataclass(frozen=True)
class Scenario:
    name: str
    order: Order
    status: SagaStatus
    compensated: tuple[str, ...] = ()
    do: dict[str, tuple[str, ...]] = field(default_factory=dict)
    undo: dict[str, tuple[str, ...]] = field(default_factory=dict)
    knobs: Knobs = Knobs()
    script: tuple[Op, ...] = (("settle",),)
    definition: Saga[Order] = order_fulfilment

    @property
    def saga_id(self) -> str:
        return f"order-{self.name}"


def order(**faults: Any) -> Order:
    return Order(
        id="o-1", customer="cus-1", lines=[Line(sku="sku-1", quantity=2)], total_cents=4200, **faults
    )


OK3 = {"reserve_stock": ("ok",), "charge_payment": ("ok",), "arrange_shipping": ("ok",)}
SCENARIOS = [
    Scenario("happy", order(), SagaStatus.COMPLETED, do=OK3),
    Scenario(
        "declined_card",
        order(card="declined"),
        SagaStatus.COMPENSATED,
        compensated=("reserve_stock",),
        do={"reserve_stock": ("ok",), "charge_payment": ("permanent",), "arrange_shipping": ()},
        undo={"reserve_stock": ("ok",)},
    ),
    Scenario(
        "unserved_region",
        order(region="nowhere"),
        SagaStatus.COMPENSATED,
        compensated=("charge_payment", "reserve_stock"),  # refund, then release
        do={"reserve_stock": ("ok",), "charge_payment": ("ok",), "arrange_shipping": ("permanent",)},
        undo={"reserve_stock": ("ok",), "charge_payment": ("ok",)},
    ),
    Scenario(
        "flaky_participants",
        order(flaky=2),
        SagaStatus.COMPLETED,
        do=dict.fromkeys(OK3, ("transient", "transient", "ok")),
    ),
    Scenario(
        "flaky_beyond_retries",
        order(flaky=5),
        SagaStatus.DEAD_LETTERED,
        do={"reserve_stock": ("transient",) * 5, "charge_payment": (), "arrange_shipping": ()},
    ),
    Scenario(
        "operator_retries",
        order(flaky=5),
        SagaStatus.COMPLETED,
        do=dict.fromkeys(OK3, ("transient",) * 5 + ("ok",)),
        script=(("settle",), ("retry",), ("settle",), ("retry",), ("settle",), ("retry",), ("settle",)),
    ),
    Scenario(
        "cancel_dead_lettered",
        order(flaky=5),
        SagaStatus.CANCELLED,
        do={"reserve_stock": ("transient",) * 5, "charge_payment": (), "arrange_shipping": ()},
        script=(("settle",), ("cancel",), ("settle",)),
    ),
    Scenario(
        "cancel_mid_flight",
        order(),
        SagaStatus.CANCELLED,
        compensated=("charge_payment", "reserve_stock"),  # the in-flight charge too
        do={"reserve_stock": ("ok",), "charge_payment": ("ok",), "arrange_shipping": ()},
        undo={"reserve_stock": ("ok",), "charge_payment": ("ok",)},
        knobs=Knobs(cancel_on_charge=True),
    ),
    Scenario(
        "compensation_fails_for_good",
        order(region="nowhere"),
        SagaStatus.DEAD_LETTERED,
        compensated=("charge_payment",),
        do={"reserve_stock": ("ok",), "charge_payment": ("ok",), "arrange_shipping": ("permanent",)},
        undo={"charge_payment": ("permanent",)},
        knobs=Knobs(refund="down"),
    ),
    Scenario(
        "compensation_flaky",
        order(region="nowhere"),
        SagaStatus.COMPENSATED,
        compensated=("charge_payment", "reserve_stock"),
        do={"reserve_stock": ("ok",), "charge_payment": ("ok",), "arrange_shipping": ("permanent",)},
        undo={"reserve_stock": ("transient", "transient", "ok"), "charge_payment": ("ok",)},
        knobs=Knobs(release_flaky=2),
    ),
    Scenario(
        "shipping_down_then_back",
        order(),
        SagaStatus.COMPLETED,
        do={"reserve_stock": ("ok",), "charge_payment": ("ok",), "arrange_shipping": ("timeout", "ok")},
        # Down for the first attempt's 30 s timeout; back before the retry (40-50 ms later).
        script=(("pause", "shipping"), ("settle_for", "30"), ("resume", "shipping"), ("settle",)),
    ),
    Scenario(
        "shipping_down_for_good",
        order(),
        SagaStatus.DEAD_LETTERED,
        do={"reserve_stock": ("ok",), "charge_payment": ("ok",), "arrange_shipping": ("timeout",) * 5},
        script=(("pause", "shipping"), ("settle",)),
    ),
    Scenario(
        "force_complete_dead_lettered_step",
        order(),
        SagaStatus.COMPLETED,
        do={
            "reserve_stock": ("ok",),
            "charge_payment": ("ok",),
            "arrange_shipping": ("timeout",) * 5 + ("forced",),
        },
        script=(("pause", "shipping"), ("settle",), ("force", "arrange_shipping"), ("settle",)),
    ),
    Scenario(
        "local_actions_compensated",
        order(region="nowhere", flaky=1),
        SagaStatus.COMPENSATED,
        compensated=("charge_payment", "wrap", "reserve_stock"),
        do={
            "reserve_stock": ("transient", "ok"),
            "wrap": ("transient", "ok"),
            "charge_payment": ("transient", "ok"),
            "arrange_shipping": ("transient", "permanent"),
        },
        undo={"reserve_stock": ("ok",), "wrap": ("ok",), "charge_payment": ("ok",)},
        definition=gift_order,
    ),
    Scenario(
        "local_actions_cancelled_mid_flight",
        order(),
        SagaStatus.CANCELLED,
        compensated=("charge_payment", "wrap", "reserve_stock"),
        do={"reserve_stock": ("ok",), "wrap": ("ok",), "charge_payment": ("ok",), "arrange_shipping": ()},
        undo={"reserve_stock": ("ok",), "wrap": ("ok",), "charge_payment": ("ok",)},
        knobs=Knobs(cancel_on_charge=True),
        definition=gift_order,
    ),
]


class RunnerBackend:
    """The script on the in-process runner."""

    state: SagaState

    def __init__(self, scenario: Scenario) -> None:
        self.runner: SagaRunner | None = None

        async def cancel(saga_id: str) -> None:
            assert self.runner is not None
            self.runner.cancel(saga_id)

        self.services = Services(scenario.knobs, cancel)
        self.runner = SagaRunner(*DEFINITIONS, participants=self.services.build())

    async def play(self, scenario: Scenario) -> Summary:
        runner = self.runner
        assert runner is not None
        saga_id = runner.start(scenario.order, definition=scenario.definition, saga_id=scenario.saga_id)
        for op in scenario.script:
            match op:
                case ("settle",):
                    runner.run_until_settled()
                case ("settle_for", seconds):
                    runner.advance(seconds=float(seconds))
                case ("pause", name):
                    runner.pause(name)
                case ("resume", name):
                    runner.resume(name)
                case ("retry",):
                    runner.retry(saga_id)
                case ("cancel",):
                    runner.cancel(saga_id)
                case ("force", step):
                    runner.force_complete(saga_id, step, FORCED_OUTPUTS[step], reason="done by hand")
        runner.assert_invariants()
        self.state = runner.state(saga_id)
        return runner.summary(saga_id)


class RedisBackend:
    """The script on Redis: an orchestrator worker and one worker per participant."""

    state: SagaState

    def __init__(self, redis: bus.Redis, scenario: Scenario) -> None:
        self.redis = redis
        self.clock = FakeClock()
        self.client = SagaClient(redis, App("orders", sagas=DEFINITIONS).registry, clock=self.clock)
        self.services = Services(scenario.knobs, self.client.cancel)
        self.workers: dict[str, SagaWorker] = {
            "orders": SagaWorker(redis, App("orders", sagas=DEFINITIONS), clock=self.clock, consumer="o")
        }
        for participant in self.services.build():
            app = App(participant.name, participants=[participant])
            self.workers[participant.name] = SagaWorker(
                redis, app, clock=self.clock, consumer=participant.name
            )
        self.paused: set[str] = set()
        self.concurrent = False
        self.partition = Partition("orders", 0)
        self.streams = [self.partition.inbox.key] + [
            self.partition.commands(name).key for name in ("inventory", "payments", "shipping", "_local")
        ]

    async def _entries(self) -> int:
        return sum([await self.redis.xlen(key) for key in self.streams])

    async def idle(self) -> None:
        """Run every worker that is up until a whole pass adds no stream entry.

        One after the other, or all at once with ``concurrent`` (they then race for the
        same inbox entries and sagas, and commits conflict).
        """
        for _ in range(200):
            before = await self._entries()
            up = [w for name, w in self.workers.items() if name not in self.paused]
            if self.concurrent:
                async with anyio.create_task_group() as group:
                    for worker in up:
                        group.start_soon(worker.run_until_idle)
            else:
                for worker in up:
                    await worker.run_until_idle()
            if await self._entries() == before:
                return
        raise AssertionError("the workers never went idle")

    async def next_timer(self) -> int | None:
        rows = await self.redis.zrange(self.partition.timers, 0, 0, withscores=True)
        return int(rows[0][1]) if rows else None

    async def settle(self, saga_id: str, until_ms: int | None = None) -> None:
        """Like SagaRunner.run_until_settled (or advance, with ``until_ms``): timer to timer."""
        await self.idle()
        while True:
            if until_ms is None and (await self.client.get(saga_id)).status in SETTLED:
                break
            due = await self.next_timer()
            if due is None or (until_ms is not None and due > until_ms):
                break
            self.clock.set(max(due, self.clock.now_ms()))
            await self.idle()
        if until_ms is not None:
            self.clock.set(until_ms)

    async def play(self, scenario: Scenario) -> Summary:
        saga_id = await self.client.start(scenario.definition, scenario.order, saga_id=scenario.saga_id)
        for op in scenario.script:
            match op:
                case ("settle",):
                    await self.settle(saga_id)
                case ("settle_for", seconds):
                    await self.settle(saga_id, until_ms=self.clock.now_ms() + int(float(seconds) * 1000))
                case ("pause", name):
                    self.paused.add(name)
                case ("resume", name):
                    self.paused.discard(name)
                case ("retry",):
                    await self.client.send(saga_id, RETRY_REQUEST, OperatorRequest(by="test"))
                case ("cancel",):
                    await self.client.cancel(saga_id)
                case ("force", step):
                    output = msgspec.Raw(msgspec.json.encode(FORCED_OUTPUTS[step]))
                    request = OperatorRequest(by="test", reason="done by hand", step=step, output=output)
                    await self.client.send(saga_id, FORCE, request)
        return await self.summary(scenario.definition, saga_id)

    async def summary(self, definition: Saga[Order], saga_id: str) -> Summary:
        """The saga's summary, after checking its Redis records against the decider."""
        self.state = state = await self.client.get(saga_id)
        raw = await self.redis.lrange(self.partition.history(saga_id), 0, -1)
        history = decode_history(raw, state=state)
        # The Redis runtime decided exactly what the decider decides, entry by entry...
        assert replay(definition, raw, saga_id=saga_id, state=state) == state
        # ...and its records keep the invariants.
        assert invariant_violations(definition, state, history) == []
        return summarize(state, history)


SETTLED = {SagaStatus.DEAD_LETTERED} | {s for s in SagaStatus if s.terminal}


def timeline(state: SagaState) -> dict[str, list[tuple[str, int, str | None, int, int | None]]]:
    """Every attempt with its times relative to the saga's start: equal clocks, equal timelines."""
    start = state.created_ms
    return {
        name: [
            (
                a.kind,
                a.n,
                a.outcome,
                a.dispatched_ms - start,
                None if a.ended_ms is None else a.ended_ms - start,
            )
            for a in step.attempts
        ]
        for name, step in state.steps.items()
    }


def expected(scenario: Scenario) -> dict[str, Any]:
    return {
        "status": scenario.status,
        "compensated": scenario.compensated,
        "do": scenario.do,
        "undo": {k: v for k, v in scenario.undo.items() if v},
    }


def observed(summary: Summary) -> dict[str, Any]:
    return {
        "status": summary.status,
        "compensated": summary.compensated,
        "do": {name: step.do for name, step in summary.steps.items()},
        "undo": {name: step.undo for name, step in summary.steps.items() if step.undo},
    }


def effects_once(services: Services) -> None:
    twice = [e for e, n in Counter(services.effects).items() if n > 1]
    assert twice == [], f"effects applied more than once: {twice}"


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_scenario_on_the_runner_matches_redis(scenario: Scenario, redis: bus.Redis) -> None:
    on_runner = RunnerBackend(scenario)
    runner_summary = await on_runner.play(scenario)
    assert observed(runner_summary) == expected(scenario)
    effects_once(on_runner.services)

    on_redis = RedisBackend(redis, scenario)
    with anyio.fail_after(60):
        redis_summary = await on_redis.play(scenario)
    assert redis_summary == runner_summary
    assert timeline(on_redis.state) == timeline(on_runner.state)
    assert sorted(on_redis.services.effects) == sorted(on_runner.services.effects)
    effects_once(on_redis.services)


async def test_a_batch_of_demo_orders_ends_alike_on_the_runner_and_redis(redis: bus.Redis) -> None:
    # Many sagas in flight at once, two orchestrator workers racing for one inbox and every
    # worker running concurrently: interleaved replies and timers, commit conflicts, the
    # orchestrators' caches. Each saga's records must still match the runner's exactly.
    from redsaga.examples.demo import make_orders

    orders = make_orders(40, seed=11)
    knobs = Knobs(release_flaky=1)
    on_runner = RunnerBackend(Scenario("batch", orders[0], SagaStatus.COMPLETED, knobs=knobs))
    runner = on_runner.runner
    assert runner is not None
    for n, item in enumerate(orders):
        runner.start(item, definition=DEFINITIONS[n % 2], saga_id=item.id)
    runner.run_until_settled()
    runner.assert_invariants()

    on_redis = RedisBackend(redis, Scenario("batch", orders[0], SagaStatus.COMPLETED, knobs=knobs))
    on_redis.workers["orders-2"] = SagaWorker(
        redis, App("orders", sagas=DEFINITIONS), clock=on_redis.clock, consumer="o2"
    )
    on_redis.concurrent = True
    for n, item in enumerate(orders):
        await on_redis.client.start(DEFINITIONS[n % 2], item, saga_id=item.id)
    with anyio.fail_after(60):
        await on_redis.idle()
        while not all(s.status in SETTLED for s in [await on_redis.client.get(o.id) for o in orders]):
            due = await on_redis.next_timer()
            assert due is not None, "sagas are waiting on nothing"
            on_redis.clock.set(max(due, on_redis.clock.now_ms()))
            await on_redis.idle()

    ends: Counter[SagaStatus] = Counter()
    for n, item in enumerate(orders):
        redis_summary = await on_redis.summary(DEFINITIONS[n % 2], item.id)
        assert redis_summary == runner.summary(item.id), item
        assert timeline(on_redis.state) == timeline(runner.state(item.id)), item
        ends[redis_summary.status] += 1
    assert sorted(on_redis.services.effects) == sorted(on_runner.services.effects)
    effects_once(on_redis.services)
    assert {SagaStatus.COMPLETED, SagaStatus.COMPENSATED} <= set(ends), ends
