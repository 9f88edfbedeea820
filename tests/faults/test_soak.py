"""Soak: a steady load of sagas over two workers while random process faults hit them.

The faults are this suite's catalogue items for processes (1, 2, 3: SIGKILL, a
crash point armed on a fresh worker, SIGSTOP past the lease), picked by the printed seed.
The load runs for ``--soak-minutes`` (0.5 by default, so the normal suite runs a short
soak; ``pytest -m soak --soak-minutes 10`` for a long one), then the faults stop, the
workers are healed and the checker asserts G1-G8 over every saga started.
"""

from __future__ import annotations

import functools
import random
import time

import pytest

from bus import _crash
from tests.faults.app import FOREVER, STEPS, Order
from tests.faults.procs import Proc
from tests.faults.scenario import Scenario
from tests.helpers import eventually

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.faults,
    pytest.mark.soak,
    pytest.mark.redis,
    pytest.mark.postgres,
]

CRASH_POINTS = (_crash.AFTER_SIDE_EFFECT, _crash.BEFORE_COMMIT, _crash.AFTER_COMMIT_BEFORE_ACK)
FAULTS = ("none", "none", "sigkill", "crash_point", "sigstop")
BATCH = 10
IN_FLIGHT = 30


def random_order(rng: random.Random, n: int) -> Order:
    """An order with the saga-level faults of catalogue items 5 and 23, at random."""
    fail_step = rng.choice(["", "", "", *STEPS])
    undo_fails = {}
    if fail_step and rng.random() < 0.5:
        undo_fails[rng.choice(STEPS)] = rng.choice([1, 2, 2, FOREVER])
    raise_step = rng.choice(STEPS) if rng.random() < 0.03 else ""
    return Order(id=f"s{n}", fail_step=fail_step, undo_fails=undo_fails, raise_step=raise_step)


class Pool:
    """Keeps two workers running, replacing any that died (a crash point, a SIGKILL)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.workers: list[Proc] = []
        self.spawned = 0

    async def fill(self, *, crash_at: str | None = None) -> None:
        """Replace dead workers; ``crash_at`` arms the first replacement."""
        self.workers = [w for w in self.workers if w.alive]
        while len(self.workers) < 2:
            self.spawned += 1
            name = f"w{self.spawned}"
            self.workers.append(await self.scenario.worker(name, crash_at=crash_at))
            crash_at = None

    async def inject(self, fault: str, rng: random.Random) -> str:
        """Inject one fault; return what was done, for the log."""
        victim = rng.choice(self.workers)
        if fault == "sigkill":
            victim.kill()
        elif fault == "crash_point":
            victim.kill()
            point = f"{rng.choice(CRASH_POINTS)}:{rng.randint(1, 20)}"
            await self.fill(crash_at=point)
            return f"{fault} {point}"
        elif fault == "sigstop":
            victim.stop()
            # past the lease: until the other worker has taken over everything it held
            await eventually(
                functools.partial(self._taken_over, victim), 30, f"{victim.name}'s entries are taken over"
            )
            victim.resume()
        await self.fill()
        return f"{fault} {victim.name}"

    async def _taken_over(self, proc: Proc) -> bool:
        await self.fill()  # the other worker may have crashed meanwhile (an armed crash point)
        return await self._holds_nothing(proc)

    async def _holds_nothing(self, proc: Proc) -> bool:
        redis = self.scenario.redis
        for stream, groups in (await self.scenario.checker.groups()).items():
            for group in groups:
                for consumer in await redis.xinfo_consumers(stream, group["name"]):
                    if consumer["name"].decode() == proc.name and consumer["pending"]:
                        return False
        return True


async def test_soak_random_process_faults_keep_every_invariant(
    scenario: Scenario, soak_minutes: float
) -> None:
    """Steady load over two workers, random faults by seed; G1-G8 hold at the end."""
    rng = scenario.rng
    pool = Pool(scenario)
    await pool.fill()
    ids: list[str] = []
    done: list[str] = []
    deadline = time.monotonic() + soak_minutes * 60  # how long the load runs, not a wait
    while time.monotonic() < deadline:
        ids += await scenario.start(random_order(rng, len(ids) + i) for i in range(BATCH))
        done.append(await pool.inject(rng.choice(FAULTS), rng))
        in_flight = functools.partial(_fewer_open, pool, ids)
        await eventually(in_flight, 60, f"fewer than {IN_FLIGHT} sagas in flight", poll=0.1)
    for worker in pool.workers:
        if worker.stopped:
            worker.resume()
    await pool.fill()
    print(f"soak: {len(ids)} sagas, faults: {done}")
    await scenario.check(ids, timeout=90)


async def _fewer_open(pool: Pool, ids: list[str]) -> bool:
    # Both workers may be gone meanwhile: an armed replacement reaches its crash point, and
    # the other one may be an earlier armed replacement that reaches its own.
    await pool.fill()
    return len(await pool.scenario.checker.ended(ids)) < IN_FLIGHT
