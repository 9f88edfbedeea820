"""Process-crash scenarios (catalogue items 1, 2, 3, 4, 5, 23, 26) with real worker processes.

Every test runs ``tests/faults/app.py`` workers on a real Redis database, records effects
in PostgreSQL, injects its fault (a crash point, SIGKILL, SIGSTOP, a poisoned step, a
killed Redis) and ends with the checker (``tests/faults/checker.py``) asserting G1-G8.
Every wait is a bounded poll for an observable state; nothing sleeps for time to pass.
"""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import pytest

from bus import _crash
from saga import SagaStatus, StepStatus
from saga.store.keys import Partition
from tests.faults.app import (
    CONTEXT,
    DO_RETRY,
    FOREVER,
    LEASE_MS,
    MAX_DELIVERIES,
    UNDO_RETRY,
    Order,
    gate_key,
)
from tests.faults.checker import Fence
from tests.faults.scenario import Scenario, open_scenario
from tests.faults.servers import PrivateRedis
from tests.helpers import eventually

ABANDONED = "handler abandoned; the entry stays pending for another consumer"
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.faults,
    pytest.mark.redis,
    pytest.mark.postgres,
    pytest.mark.on_cluster,  # the scenarios run on the test cluster too
]


@pytest.mark.parametrize(
    "point", [_crash.AFTER_SIDE_EFFECT, _crash.BEFORE_COMMIT, _crash.AFTER_COMMIT_BEFORE_ACK]
)
async def test_crash_point_kills_a_worker_and_the_next_one_applies_nothing_twice(
    scenario: Scenario, point: str
) -> None:
    """Catalogue item 1 (after the side effect, before recording it) and 2 (before and after the
    commit): the crashed worker's entries are redelivered; one effect per key (G2), no
    transition applied twice (G4), nothing left pending (G7)."""
    nth = scenario.rng.randint(2, 12)
    doomed = await scenario.worker("doomed", crash_at=f"{point}:{nth}")
    ids = await scenario.start(Order(id=f"o{n}") for n in range(8))
    assert await doomed.wait_exit() == -signal.SIGKILL, f"{point}:{nth} did not crash the worker"
    await scenario.worker("heir")
    await scenario.check(ids, dead_letters=0)
    if point == _crash.AFTER_SIDE_EFFECT:
        # the effect was applied and never recorded: the heir ran the handler again and the
        # participant's dedupe (UNIQUE key, in the effect's transaction) refused a second one
        redone = scenario.query(
            "SELECT a.idem_key FROM attempts a JOIN attempts b USING (idem_key)"
            " WHERE a.worker = 'doomed' AND a.phase = 'applied'"
            " AND b.worker = 'heir' AND b.phase = 'duplicate'"
        )
        assert redone, "no handler ran again after the crash"


async def test_sigkill_with_500_sagas_in_flight_loses_nothing_and_applies_nothing_twice(
    scenario: Scenario,
) -> None:
    """SIGKILL the only worker at a random moment with 500 sagas in flight (some of them
    compensating); another worker finishes them all: G1-G8."""
    first = await scenario.worker("first")
    ids = await scenario.start(scenario.mixed(500, ["", "", "", "pack", "ship"]))
    kill_at = scenario.rng.randrange(len(ids) // 10, len(ids) // 2)

    async def ended() -> bool:
        return len(ids) - len(await scenario.checker.ended(ids)) >= kill_at

    await eventually(ended, 60, f"{kill_at} sagas ended", poll=0.01)
    first.kill()
    assert await scenario.checker.ended(ids), "the kill came too late to test anything"
    await scenario.worker("second")
    await scenario.check(ids, timeout=90, dead_letters=0)


async def test_stalled_worker_past_its_lease_is_fenced_and_applies_nothing(scenario: Scenario) -> None:
    """Catalogue item 3: SIGSTOP a worker inside a handler past its lease; another worker takes the
    command over; on SIGCONT the stalled worker is fenced (its heartbeat is refused, or its
    watchdog gives up on the unrenewed lease, whichever runs first), so it abandons the
    handler before its effect (G5); one effect (G2)."""
    stalled = await scenario.worker("stalled")
    [saga_id] = await scenario.start([Order(id="o-stall", hold_step="charge")])
    key = f"{saga_id}:charge:do"
    await scenario.wait_calls(key, 1, "stalled")
    stalled.stop()
    fence = Fence("stalled", key, since=scenario.last_attempt(), attempt=1, delivery=1)
    await scenario.worker("successor")
    await scenario.wait_calls(key, 1, "successor")  # it took the command over
    stalled.resume()
    with anyio.move_on_after(10):  # bounded: without the fence the line never comes, and G5 says why
        await stalled.wait_for(ABANDONED)
    await scenario.redis.set(gate_key(saga_id), 1)
    await scenario.check([saga_id], dead_letters=0, fenced=[fence])
    assert scenario.query("SELECT worker FROM effects WHERE idem_key = %s", key) == [("successor",)]
    assert stalled.saw(ABANDONED)
    assert stalled.alive


async def test_cpu_bound_handler_longer_than_the_lease_runs_once(scenario: Scenario) -> None:
    """Catalogue item 4: a handler computes for twice the lease in a worker thread (the documented
    way to run blocking code: docs/bus.md); the loop keeps heartbeating, so no other worker
    reclaims it: one call, one effect. (Blocking the loop itself past the lease is the
    documented limit: see docs/faults.md.)"""
    await scenario.worker("w1")
    await scenario.worker("w2")
    orders = [
        Order(id="o-spin", spin_step="pack", spin_ms=2 * LEASE_MS),
        *(Order(id=f"o{n}") for n in range(4)),
    ]
    ids = await scenario.start(orders)
    await scenario.check(ids, dead_letters=0)
    assert scenario.calls("o-spin:pack:do") == 1, "the command was reclaimed while its handler computed"


async def test_step_that_always_raises_dead_letters_its_saga_and_others_flow(scenario: Scenario) -> None:
    """Catalogue item 5, saga level: a participant that always raises: each attempt fails, the
    step's retries run out and the saga is dead-lettered with its error (G6); the other
    sagas complete."""
    await scenario.worker("w1")
    ids = await scenario.start(
        [Order(id="o-poison", raise_step="charge"), *(Order(id=f"o{n}") for n in range(6))]
    )
    await scenario.check(ids, dead_letters=0)
    poisoned = await scenario.client.get("o-poison")
    attempts = poisoned.steps["charge"].attempts
    assert len(attempts) == DO_RETRY.attempts
    assert all(a.error and "backend refused" in a.error for a in attempts)
    assert poisoned.error is not None
    assert poisoned.error.step == "charge"


async def test_step_that_crashes_its_worker_is_dead_lettered_after_the_delivery_limit(
    scenario: Scenario,
) -> None:
    """Catalogue item 5, process variant: the handler kills its worker on every delivery. After
    ``MAX_DELIVERIES`` the command is dead-lettered, atomically with its ack (no second
    letter, nothing pending: G6, G7); the step times out and its next attempt completes the
    saga; the other sagas complete."""
    ids = await scenario.start(
        [Order(id="o-crash", crash_step="charge"), *(Order(id=f"o{n}") for n in range(6))]
    )
    crashes = 0
    async with anyio.create_task_group() as group:

        async def supervise() -> None:
            nonlocal crashes
            while True:
                worker = await scenario.worker(f"w{crashes}")
                await worker.wait_exit(timeout=60)
                crashes += 1

        group.start_soon(supervise)
        await scenario.checker.quiesce(ids, timeout=60)
        group.cancel_scope.cancel()
    await scenario.check(ids)
    letters = [x for x in await scenario.checker.dead_letters() if x["correlation_id"] == "o-crash"]
    assert len(letters) == 1, letters
    assert letters[0]["header.step"] == "charge"
    assert int(letters[0]["deliveries"]) == MAX_DELIVERIES + 1
    assert crashes == MAX_DELIVERIES


async def test_orchestrator_killed_while_compensating_undoes_each_step_once(scenario: Scenario) -> None:
    """Catalogue item 23: step 3 of 5 fails; the worker is SIGKILLed while the saga compensates;
    ``charge``'s compensation fails twice then succeeds (undo pack-less: charge, then
    reserve, each once, in reverse order: G3); a variant whose compensation fails for good
    is dead-lettered with its context and undoes nothing after it."""
    first = await scenario.worker("first")
    retried = [Order(id=f"o-retried{n}", fail_step="pack", undo_fails={"charge": 2}) for n in range(2)]
    stuck = [Order(id=f"o-stuck{n}", fail_step="pack", undo_fails={"charge": FOREVER}) for n in range(2)]
    ids = await scenario.start([*retried, *stuck])

    async def compensating() -> bool:
        return SagaStatus.COMPENSATING in [await scenario.status(i) for i in ids]

    await eventually(compensating, 20, "a saga compensates", poll=0.01)
    first.kill()
    await scenario.worker("second")
    await scenario.check(ids, dead_letters=0)
    for order in retried:  # (a handler killed mid-call runs again: count the saga's attempts)
        state = await scenario.client.get(order.id)
        undos = [a for a in state.steps["charge"].attempts if a.kind == "undo"]
        assert [a.outcome for a in undos] == ["transient", "transient", "ok"]
    for order in stuck:
        state = await scenario.client.get(order.id)
        assert state.steps["charge"].status == StepStatus.COMPENSATION_FAILED
        undos = [a for a in state.steps["charge"].attempts if a.kind == "undo"]
        assert len(undos) == UNDO_RETRY.attempts
        assert all(a.error for a in undos)
        assert state.error is not None
        assert state.error.step == "charge"
        assert scenario.calls(f"{order.id}:reserve:undo") == 0


STORM_MIX = ("", "ship", *("reserve",) * 6)
"""The storm's sagas: complete, compensate three steps, or fail at once (cheap, so that
the storm is about claiming and timers rather than throughput)."""


@pytest.mark.slow
async def test_restart_storm_over_pending_entries_and_due_timers(
    aof_redis: PrivateRedis, pg_dsn: str, tmp_path: Path
) -> None:
    """Catalogue item 26: every worker and Redis die with 1,000 commands pending (read by a consumer
    that never came back) and 500 timers; Redis restarts from its AOF; three workers start
    at once. Each claims in bounded batches (never more entries than its free slots, so no
    command is claimed twice), no effect is applied twice, every saga ends."""
    async with open_scenario(aof_redis.url, pg_dsn, tmp_path / "logs") as scenario:
        orders = [Order(id=f"o{n}", fail_step=scenario.rng.choice(STORM_MIX)) for n in range(1_000)]
        ids = await scenario.start(orders)
        ids += await scenario.start_naps((f"nap{n}" for n in range(500)), ms=200)
        commands = Partition(CONTEXT.name, 0).commands("shop").key
        await scenario.redis.xgroup_create(commands, "shop", id="0", mkstream=True)
        read = await scenario.redis.xreadgroup("shop", "gone", {commands: ">"}, count=5_000)
        assert sum(len(batch) for _, batch in read) == 1_000
        timers = await scenario.redis.zcard(Partition(CONTEXT.name, 0).timers)
        assert timers >= 500
        await aof_redis.restart()
        for n in range(3):
            scenario.spawn(f"w{n}")
        await scenario.check(ids, timeout=150, dead_letters=0)
        # bounded claims: a worker claims no more than it has free slots, so no claimed
        # command waits past its lease for a slot and is claimed again (the consumer that
        # died read each one once; one claim makes two deliveries)
        [(most,)] = scenario.query("SELECT max(delivery) FROM attempts")
        assert most == 2, f"a command was delivered {most} times"
