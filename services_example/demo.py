"""The demo: run every example service in one process and push orders through them.

Orders are drawn from a seeded random generator with injected failures: declined cards
(compensated: the stock is released), unserved regions (compensated: refund, then release),
and flaky participants (transient failures that the retry policy absorbs). Orders above the
approval limit wait for a manager first; the demo's managers answer them
(``redsaga.examples.desk``), one after its escalation.

Every entry is signed and checked, as in production: unless ``REDSAGA_KEYRING`` names the
keys to use, the demo makes a master key for the run and issues one keyring holding every
principal the process runs (the orchestrator, the three participants and ``client:demo``).
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import msgspec

from bus import Redis, uuid7
from bus.lowlevel import KEYRING_ENV, encode_keyrings
from redsaga.examples.all import app
from redsaga.examples.contracts import Line, Order
from redsaga.examples.desk import ApprovalNote, DemoClock, Desk, authorize
from redsaga.examples.inventory import reserved_orders, stock
from redsaga.examples.orders import large_order, saga_for
from redsaga.examples.payments import balances, ledger
from relay import Relay, RelayConfig
from saga import EngineConfig, SagaClient, SagaStatus, SagaWorker, TaskClient
from saga.ops.keyrings import issue_keyrings, new_master, reach_of


class Outcome(msgspec.Struct, kw_only=True):
    """How many sagas ended in one status, with their retries and durations."""

    status: str
    sagas: int
    retries: int
    p50_ms: float
    p99_ms: float


class DemoReport(msgspec.Struct, kw_only=True):
    """What the demo did and whether the books balance.

    ``signed_by`` lists the principals whose keyrings signed and checked every entry (empty
    with signing off); ``approvals`` how each large order's approval went.
    """

    orders: int
    seconds: float
    outcomes: list[Outcome]
    ledger_balanced: bool
    stock_released: bool
    unfinished: int
    signed_by: list[str] = msgspec.field(default_factory=list)
    approvals: list[ApprovalNote] = msgspec.field(default_factory=list)


def make_orders(count: int, seed: int, run: str = "") -> list[Order]:
    """Draw ``count`` orders: ~10% declined cards, ~7% unserved regions, ~20% flaky.

    The same seed draws the same orders; ``run`` keeps their ids apart from earlier runs.
    """
    rng = random.Random(seed)
    return [draw_order(rng, f"order-{run}{seed}-{n:05d}") for n in range(count)]


def draw_order(rng: random.Random, order_id: str) -> Order:
    """One order from ``rng``: ~10% declined cards, ~7% unserved regions, ~20% flaky."""
    roll = rng.random()
    return Order(
        id=order_id,
        customer=f"customer-{rng.randrange(50)}",
        lines=[Line(sku=f"sku-{rng.randrange(20)}", quantity=rng.randint(1, 3))],
        total_cents=rng.randrange(500, 20_000),
        card="declined" if roll < 0.10 else "ok",
        region="nowhere" if 0.10 <= roll < 0.17 else "eu",
        flaky=rng.choice([1, 2]) if rng.random() < 0.2 else 0,
    )


async def run_demo(
    redis: Redis,
    *,
    orders: int = 200,
    seed: int = 7,
    db_dsn: str | None = None,
    timeout_s: float = 120.0,
    progress: Callable[[dict[str, int]], None] | None = None,
    signed: bool = True,
) -> DemoReport:
    """Start ``orders`` sagas, run the services and their relays until every saga ends, report.

    Payments and inventory keep their state in databases: two SQLite files in a temporary
    directory, or the PostgreSQL database ``db_dsn`` for both. With ``signed`` (the default)
    every entry is signed (see the module docstring).
    """
    with tempfile.TemporaryDirectory(prefix="redsaga-demo-") as scratch, _keys(signed=signed):
        ledger.dsn = db_dsn or f"sqlite:///{Path(scratch) / 'payments.db'}"
        stock.dsn = db_dsn or f"sqlite:///{Path(scratch) / 'inventory.db'}"
        return await _run(redis, orders, seed, timeout_s, progress)


@contextmanager
def _keys(*, signed: bool) -> Iterator[None]:
    """Sign the run with keys made for it, through ``REDSAGA_KEYRING`` (as a worker reads it).

    Nothing changes when signing is off or the environment names keys already.
    """
    if not signed or os.environ.get(KEYRING_ENV):
        yield
        return
    reach = reach_of(app, clients=["demo"])
    keyring = encode_keyrings(issue_keyrings(new_master(), reach, sorted(reach))).decode()
    os.environ[KEYRING_ENV] = keyring
    try:
        yield
    finally:
        del os.environ[KEYRING_ENV]


async def _run(
    redis: Redis, orders: int, seed: int, timeout_s: float, progress: Callable[[dict[str, int]], None] | None
) -> DemoReport:
    config = EngineConfig()
    clock = DemoClock()
    worker = SagaWorker(redis, app, config=config, clock=clock)
    client = SagaClient(redis, app.registry, config=config, source="demo", clock=clock)  # client:demo
    desk = Desk(TaskClient(redis, app.registry, authorize=authorize, config=config, clock=clock), clock)
    batch = make_orders(orders, seed, run=uuid7()[:13])
    # SQLite has no NOTIFY: the demo's relays poll often so replies are not held up.
    relays = [
        Relay.connect(dsn, redis, config=RelayConfig(poll_interval_s=0.02))
        for dsn in sorted({ledger.dsn, stock.dsn})
    ]
    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.started.wait()
        for one_relay in relays:
            tg.start_soon(one_relay.run)
        for order in batch:
            await client.start(saga_for(order), order, saga_id=order.id)
        with anyio.move_on_after(timeout_s):
            while True:
                counts = _by_status(await client.counts())
                if progress is not None:
                    progress(counts)
                in_flight = sum(n for s, n in counts.items() if not SagaStatus(s).terminal)
                if in_flight == 0:
                    break
                await desk.work(in_flight)
                await anyio.sleep(0.2)  # a progress display, not a timing assumption
        seconds = time.monotonic() - started
        states = [await client.get(order.id) for order in batch]
        net = await balances()
        holding = await reserved_orders()
        for one_relay in relays:
            one_relay.stop()
        worker.stop()
    by_status: dict[str, list[tuple[int, int]]] = {}
    for state in states:
        retries = sum(max(0, len(s.attempts) - 1) for s in state.steps.values() if s.attempts)
        took = clock.real_ms(state.created_ms, state.updated_ms)  # the skipped hours left out
        by_status.setdefault(state.status.value, []).append((took, retries))
    outcomes = [
        Outcome(
            status=status,
            sagas=len(rows),
            retries=sum(r for _, r in rows),
            p50_ms=float(statistics.median(d for d, _ in rows)),
            p99_ms=float(_percentile([d for d, _ in rows], 0.99)),
        )
        for status, rows in sorted(by_status.items())
    ]
    completed = {s.id for s in states if s.status == SagaStatus.COMPLETED}
    totals = {order.id: order.total_cents for order in batch}
    return DemoReport(
        orders=orders,
        seconds=round(seconds, 2),
        outcomes=outcomes,
        ledger_balanced=all(net.get(o, 0) == (totals[o] if o in completed else 0) for o in totals),
        stock_released=all(o in completed for o in holding if o in totals),
        unfinished=sum(1 for s in states if not s.status.terminal),
        signed_by=sorted(config.auth.keyrings),
        approvals=await desk.notes([o.id for o in batch if saga_for(o) is large_order]),
    )


def _by_status(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for (_, status), n in counts.items():
        totals[status] += n
    return dict(totals)


def _percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
