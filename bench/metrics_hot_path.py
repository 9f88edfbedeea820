"""What the worker's metrics cost on the hot path, per saga, measured in isolation.

    python bench/metrics_hot_path.py [--sagas 200] [--repeat 50]

Runs ``--sagas`` demo sagas (3 steps; a declined card in every tenth, so compensations
too) through one worker on the embedded Redis with the metrics hooks recording each
committed transition (the saga before, the decision after), then replays those pairs
through ``SagaTallies.transition`` ``--repeat`` times, beside the same loop calling a hook
that does nothing (the floor: the loop and the call). Also times one ``Buckets.observe``
(one per pipeline round trip and per attempt that ended). Prints one JSON object per line:
``us_per_saga`` is the transitions' cost per saga above the floor; compare it with
``cpu_us_per_unit`` of ``bench/saga_throughput.py`` (a saga's whole client CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bus
from bus.metrics import Buckets
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import app
from saga import EngineConfig, SagaClient, SagaState, SagaWorker
from saga.core.decider import Decision
from saga.metrics._transitions import SagaTallies

CONFIG = EngineConfig(auth=bus.SIGNING_OFF)


async def record(sagas: int) -> list[tuple[SagaState | None, Decision]]:
    redis = bus.connect(bus.MEMORY_URL)
    worker = SagaWorker(redis, app, config=CONFIG)
    seen: list[tuple[SagaState | None, Decision]] = []
    for orchestrator in worker.orchestrators:
        orchestrator.transitions.append(lambda before, decision: seen.append((before, decision)))
    client = SagaClient(redis, app.registry, config=CONFIG)
    for n in range(sagas):
        card = "declined" if n % 10 == 0 else "ok"
        order = Order(id=f"b{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=1, card=card)
        await client.start(order_fulfilment, order, saga_id=order.id)
    await worker.run_until_idle()
    return seen


def per_call_us(hook: object, pairs: list[tuple[SagaState | None, Decision]], repeat: int) -> float:
    started = time.process_time()
    for _ in range(repeat):
        for before, decision in pairs:
            hook(before, decision)  # type: ignore[operator]
    return (time.process_time() - started) / (repeat * len(pairs)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sagas", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=100)
    args = parser.parse_args()
    pairs = anyio.run(record, args.sagas)
    per_saga = len(pairs) / args.sagas
    tallies = SagaTallies()
    floor = min(per_call_us(lambda _b, _d: None, pairs, args.repeat) for _ in range(7))
    cost = min(per_call_us(tallies.transition, pairs, args.repeat) for _ in range(7))
    print(json.dumps({"name": "metrics.transition.floor", "us_per_call": round(floor, 3)}), flush=True)
    print(
        json.dumps(
            {
                "name": "metrics.transition",
                "us_per_call": round(cost, 3),
                "transitions_per_saga": round(per_saga, 2),
                "us_per_saga": round((cost - floor) * per_saga, 2),
            }
        ),
        flush=True,
    )
    buckets, n = Buckets(), 200_000
    started = time.process_time()
    for i in range(n):
        buckets.observe(i * 1e-6)
    observe = (time.process_time() - started) / n * 1e6
    print(json.dumps({"name": "metrics.buckets_observe", "us_per_call": round(observe, 3)}), flush=True)


if __name__ == "__main__":
    main()
