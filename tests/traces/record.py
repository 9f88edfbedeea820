"""Record the traces checked in beside this file: ``python -m tests.traces.record``.

Runs the demo (``saga demo``'s services, their SQLite databases and outbox relays, on an
embedded Redis) and exports one saga of each outcome, then drives the demo saga through the
operator paths (force-complete, retry, redrive, cancel) and exports those. Re-record only
on purpose: these files are what today's code must still replay.
"""

from __future__ import annotations

from pathlib import Path

import anyio

import bus
from redsaga.examples.all import app as demo_app
from redsaga.examples.demo import run_demo
from saga import SagaAdmin, SagaStatus, SagaWorker
from saga.ops.trace import encode_trace
from tests.ops import scenario

HERE = Path(__file__).parent


async def record_demo(redis: bus.Redis) -> dict[str, bytes]:
    """One trace per demo outcome: plain, with retries, declined card, no carrier."""
    report = await run_demo(redis, orders=60, seed=11, timeout_s=60)
    assert report.unfinished == 0, report
    admin = SagaAdmin(redis, demo_app)
    wanted = {
        "demo-completed": lambda s: (
            s.status == SagaStatus.COMPLETED and all(len(x.attempts) == 1 for x in s.steps.values())
        ),
        "demo-completed-after-retries": lambda s: (
            s.status == SagaStatus.COMPLETED and any(len(x.attempts) > 1 for x in s.steps.values())
        ),
        "demo-card-declined": lambda s: (
            s.status == SagaStatus.COMPENSATED and not s.steps["arrange_shipping"].attempts
        ),
        "demo-no-carrier": lambda s: (
            s.status == SagaStatus.COMPENSATED and bool(s.steps["arrange_shipping"].attempts)
        ),
    }
    traces: dict[str, bytes] = {}
    for status in (SagaStatus.COMPLETED, SagaStatus.COMPENSATED):
        for row in (await admin.list(status=status, limit=100)).rows:
            state = await admin.get(row.id)
            for name, matches in wanted.items():
                if name not in traces and matches(state):
                    traces[name] = encode_trace(await admin.export(row.id))
    assert set(traces) == set(wanted), sorted(traces)
    return traces


async def record_operations(redis: bus.Redis) -> dict[str, bytes]:
    """The operator paths: force-complete, retry after a fix, redrive, cancel."""
    driven = await scenario.drive(redis)
    worker = SagaWorker(redis, scenario.app, config=scenario.CONFIG, clock=driven.clock, consumer="recorder")
    admin = SagaAdmin(redis, scenario.app, clock=driven.clock, by="alice@ops", wait_s=0)
    ids = driven.ids
    await admin.force_complete(
        ids["dead_lettered"], "arrange_shipping", {"tracking": "phoned-in"}, reason="booked by phone"
    )
    scenario.FIXED.add(ids["dead_lettered_undo"])
    await admin.retry(ids["dead_lettered_undo"], reason="gateway back")
    await admin.redrive(ids["running"], "reserve_stock", reason="command lost")
    await worker.run_until_idle()
    names = {
        "ops-force-completed": ids["dead_lettered"],
        "ops-compensation-retried": ids["dead_lettered_undo"],
        "ops-redriven": ids["running"],
        "ops-cancelled": ids["cancelled"],
        "ops-failed": ids["failed"],
    }
    return {name: encode_trace(await admin.export(saga_id)) for name, saga_id in names.items()}


async def main() -> None:
    for job in (record_demo, record_operations):
        redis = bus.connect(bus.MEMORY_URL)
        try:
            for name, trace in (await job(redis)).items():
                (HERE / f"{name}.json").write_bytes(trace)
                print(f"wrote {name}.json")
        finally:
            await redis.aclose()


if __name__ == "__main__":
    anyio.run(main)
