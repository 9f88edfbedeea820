"""Redrive of a saga suspended at a signal wait, a sleep or an event wait, on Redis.

Through ``SagaAdmin`` (on fakeredis and real Redis) and through ``saga replay --from-step``
(real Redis, an orchestrator running in the background): from the waiting step itself and
from every earlier step, as a dry run (nothing is written) and for real. The loan then runs
to its end with the token mailed before the redrive, and its history replays exactly.
(The decider's rules for waits that are redriven: ``tests/saga/test_redrive_waits.py``.)
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest
from typer.testing import CliRunner

import bus
from bus import Publisher
from redsaga.cli.main import app as cli
from saga import SagaClient, SagaStatus
from saga.store.keys import Partition
from saga.testing import decode_history, invariant_violations
from tests.helpers import eventually, keys_matching, while_deciding
from tests.ops.lending import APP_REF, YES, Lending
from tests.ops.live import background_worker, flush
from tests.saga.time_sagas import TREASURY_EVENTS, FundsReady, loan

PARTITION = Partition("lending", 0)
REDRIVES = [
    ("approval", "reserve", ["reserve/do #2 -> ledger Reserve"]),
    ("approval", "ask", ["ask/do #2 -> mailer AskApproval"]),
    ("approval", "approval", []),
    ("cool_off", "reserve", ["reserve/do #2 -> ledger Reserve"]),
    ("cool_off", "approval", []),
    ("cool_off", "cool_off", []),
    ("funds", "ask", ["ask/do #2 -> mailer AskApproval"]),
    ("funds", "cool_off", []),
    ("funds", "funds", []),
]


async def written(redis: bus.Redis, saga_id: str) -> tuple[int, int, dict[bytes, bytes]]:
    """The inbox's length, the history's and the saga hash: what a dry run must not change."""
    return (
        await redis.xlen(PARTITION.inbox.key),
        await redis.llen(PARTITION.history(saga_id)),
        await redis.hgetall(PARTITION.saga(saga_id)),
    )


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("waiting", "step", "sends"), REDRIVES, ids=[f"{w}-from-{s}" for w, s, _ in REDRIVES]
)
async def test_the_admin_redrives_a_waiting_saga(
    redis: bus.Redis, waiting: str, step: str, sends: list[str]
) -> None:
    lending = Lending(redis)
    saga_id = await lending.suspended_at(waiting)
    before = await written(redis, saga_id)

    plan = await lending.admin.redrive(saga_id, step, reason="after the incident", dry_run=True)
    assert (plan.outcome, plan.dispatched) == ("dry-run", sends)
    assert await written(redis, saga_id) == before

    result = await while_deciding(
        lending.worker, lending.admin.redrive(saga_id, step, reason="after the incident")
    )
    assert (result.outcome, result.dispatched) == ("applied", sends)
    await lending.idle()
    state = await lending.client.get(saga_id)
    assert state.status == SagaStatus.SUSPENDED
    assert state.wait is not None
    assert state.wait.step == waiting  # the waits before it had ended: they ended again at once

    if waiting == "approval":
        await lending.client.signal(lending.tokens[0], YES)  # the token mailed before the redrive
        await lending.idle()
    if waiting in ("approval", "cool_off"):
        await lending.advance(3_600)  # the sleep, begun again at the redrive if it was sleeping
    await lending.funds()
    state = await lending.client.get(saga_id)
    assert state.status == SagaStatus.COMPLETED
    assert len(set(lending.tokens)) == 1  # one token was ever mailed
    assert lending.effects == [("L1", "reserve"), ("L1", "disburse")]  # nothing happened twice
    assert (await lending.admin.replay(saga_id)).ok
    raw = await redis.lrange(PARTITION.history(saga_id), 0, -1)
    assert invariant_violations(loan, state, decode_history(raw, state=state)) == []
    assert await keys_matching(redis, "rs:{lending:w:*}:wait:*") == []  # no event registration left behind


# -- the command line ---------------------------------------------------------------------


STEPS = [s.name for s in loan.steps]


@pytest.fixture(params=["approval", "cool_off", "funds"])
def live_loan(request: pytest.FixtureRequest, real_redis_url: str) -> Iterator[tuple[str, Lending, str]]:
    """Real Redis holding a loan suspended at a wait, an orchestrator deciding in the background."""
    waiting: str = request.param

    async def prepare() -> Lending:
        redis = bus.connect(real_redis_url)
        try:
            await redis.flushdb()
            lending = Lending(redis)
            await lending.suspended_at(waiting)
            return lending
        finally:
            await redis.aclose()

    lending = anyio.run(prepare)
    try:
        with background_worker(real_redis_url, lending.app, lending.clock):
            yield real_redis_url, lending, waiting
    finally:
        flush(real_redis_url)


def saga(url: str, *args: str) -> tuple[int, str]:
    env = {"REDSAGA_REDIS_URL": url, "REDSAGA_APP": APP_REF, "REDSAGA_OPERATOR": "alice@ops"}
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.output


def test_saga_replay_from_step_redrives_a_waiting_saga(live_loan: tuple[str, Lending, str]) -> None:
    url, lending, waiting = live_loan

    async def read() -> tuple[int, int, dict[bytes, bytes]]:
        redis = bus.connect(url)
        try:
            return await written(redis, "L1")
        finally:
            await redis.aclose()

    before = anyio.run(read)
    for step in STEPS[: STEPS.index(waiting) + 1]:
        code, out = saga(url, "replay", "L1", "--from-step", step, "--dry-run")
        assert code == 0, out
        assert "every decision matches" in out
        assert "dry run: redrive of L1 would apply; nothing was sent" in out
    assert anyio.run(read) == before

    code, out = saga(url, "replay", "L1", "--from-step", "reserve", "--reason", "after the incident (INC-7)")
    assert code == 0, out
    assert "redrive of L1 applied" in out
    assert "sends       reserve/do #2 -> ledger Reserve" in out

    async def resume() -> None:
        redis = bus.connect(url)
        client = SagaClient(redis, lending.app.registry, clock=lending.clock)
        try:

            async def at(step: str) -> bool:
                state = await client.get("L1")
                return (
                    state.wait is not None
                    and state.wait.step == step
                    and state.steps[step].status == "waiting"
                )

            await eventually(lambda: at(waiting), 10, f"the redriven loan waited at {waiting} again")
            state = await client.get("L1")
            assert [a.outcome for a in state.steps[waiting].attempts] == ["cancelled", None]
            assert state.error is not None
            assert (state.error.what, state.error.by) == ("operator redrive", "alice@ops")
            if waiting == "approval":
                await client.signal(lending.tokens[0], YES)  # the one token, mailed before the redrive
                await eventually(lambda: at("cool_off"), 10, "the approval resumed the loan")
            if waiting in ("approval", "cool_off"):
                lending.clock.advance(3_600)
                await eventually(lambda: at("funds"), 10, "the cool-off ended")
            await Publisher(redis, source="treasury").publish(
                TREASURY_EVENTS, FundsReady(loan_id="L1", ref="w")
            )

            async def completed() -> bool:
                return (await client.get("L1")).status == SagaStatus.COMPLETED

            await eventually(completed, 10, "the funds completed the loan")
        finally:
            await redis.aclose()

    anyio.run(resume)
    assert len(set(lending.tokens)) == 1
    assert lending.effects == [("L1", "reserve"), ("L1", "disburse")]
