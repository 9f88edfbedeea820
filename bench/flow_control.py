"""Redis commands per saga with a rate limit or a concurrency key, beside the same saga without.

    python bench/flow_control.py [--redis-url redis://127.0.0.1:6379/13] [--sagas 200]

Runs the example saga (reserve stock, charge, ship; the stateless participants) in one
process on a fake clock, ``--sagas`` at once, five ways: no limit declared; a limit on
``payments`` that every command finds a token in (the gate's own price: one take per
charge); a limit that holds all but the burst (each held charge waits as a durable timer
until its token, then is sent: the price of waiting); a concurrency key on the order id,
every saga in a line of its own (the slot gate's own price: a slot taken and given back);
and a key shared by ten customers' orders, limit 1 (all but ten sagas wait in line, are woken
when a slot frees, and look again). Counts, per saga, the commands Redis
ran (``INFO commandstats`` before and after: a function call is one ``fcall`` plus every
``redis.call`` inside it) and the client's CPU time (noisy; the instruction counts of
``bench/instructions.py --limits`` and ``--keys`` are the steadier price). Prints one JSON line
per variant.
The database is flushed first.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bus
from bus import FakeClock
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import inventory, payments, shipping
from saga import App, EngineConfig, Key, RateLimit, Saga, SagaClient, SagaStatus, SagaWorker

CONFIG = EngineConfig(retention_s=0, auth=bus.SIGNING_OFF)
VARIANTS = {
    "none": ((), None),
    "rate_never_waits": ((RateLimit("payments", 1_000_000.0, burst=1_000_000),), None),
    "rate_holds_all_but_burst": ((RateLimit("payments", "100/s", burst=1),), None),
    "key_never_waits": ((), Key(lambda o: o.id)),
    "key_ten_lines_of_one": ((), Key(lambda o: o.customer)),
}


def definition_for(key: Key | None) -> Saga[Order]:
    """The example saga, with ``key`` as its concurrency key (the same steps)."""
    if key is None:
        return order_fulfilment
    keyed = copy.copy(order_fulfilment)
    keyed.concurrency = key.named(keyed.name)
    return keyed


async def commandstats(redis: bus.Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def ended(client: SagaClient) -> int:
    return sum(n for (_, status), n in (await client.counts()).items() if SagaStatus(status).terminal)


async def run(url: str, variant: str, sagas: int) -> dict[str, object]:
    redis = bus.connect(url)
    await redis.flushdb()
    limits, key = VARIANTS[variant]
    definition = definition_for(key)
    app = App("bench-flow", sagas=[definition], participants=[inventory, payments, shipping], limits=limits)
    clock = FakeClock()
    worker = SagaWorker(redis, app, config=CONFIG, clock=clock)
    client = SagaClient(redis, app.registry, config=CONFIG, clock=clock)
    await worker.bus_worker.setup()
    await redis.config_resetstat()
    before, cpu = await commandstats(redis), time.process_time()
    for n in range(sagas):
        order = Order(id=f"o{n}", customer=f"c{n % 10}", lines=[Line(sku="s", quantity=1)], total_cents=1)
        await client.start(definition, order, saga_id=f"s{n}")
    await worker.run_until_idle()
    while await ended(client) < sagas:  # held charges (tokens due) and sagas in line (their looks) go
        clock.advance(sagas / 100 + 1)
        await worker.run_until_idle()
    cpu = time.process_time() - cpu
    after = await commandstats(redis)
    completed = sum(n for (_, status), n in (await client.counts()).items() if status == SagaStatus.COMPLETED)
    assert completed == sagas, completed
    await redis.aclose()
    calls = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    calls = {name: n for name, n in sorted(calls.items()) if n and name not in ("config|resetstat", "info")}
    return {
        "name": f"flow_control.{variant}",
        "sagas": sagas,
        "redis_commands_per_saga": round(sum(calls.values()) / sagas, 2),
        "fcalls_per_saga": round(calls.get("fcall", 0) / sagas, 2),
        "client_cpu_us_per_saga": round(cpu * 1e6 / sagas),
        "calls_per_saga": {name: round(n / sagas, 2) for name, n in calls.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDSAGA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
    )
    parser.add_argument("--sagas", type=int, default=200)
    args = parser.parse_args()
    for variant in VARIANTS:
        print(json.dumps(anyio.run(run, args.redis_url, variant, args.sagas)), flush=True)


if __name__ == "__main__":
    main()
