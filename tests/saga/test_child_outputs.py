"""A child step's output is its child's last step's output, for every kind of last step.

Each kind (``tests/saga/last_steps.py``) runs as a child saga's last step on the in-process
runner and on Redis (fakeredis and real): the parent completes, and its ``kid`` step reads
back what the child's last step produced -- decoded as the child's own ``ctx.output`` would
(a first-of-N winner as its branch's type, a map as its list). Both backends end alike, the
Redis histories replay exactly, and no report or reply is dead-lettered on the way.
"""

from __future__ import annotations

import anyio
import pytest

import bus
from saga import SagaStatus
from saga.store.keys import Partition
from saga.testing import Summary
from tests.helpers import dead_letters
from tests.saga.compose_backends import RedisBackend, RunnerBackend
from tests.saga.compose_sagas import Worked
from tests.saga.last_steps import CHILDREN, DEFINITIONS, EVENTS, KINDS, PLAN, Kind, Posted

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]


async def run(backend: RunnerBackend | RedisBackend, kind: Kind) -> tuple[Summary, object]:
    """Run ``kind``'s parent to its end (delivering the wait's signal or event).

    Returns the parent's summary and its ``kid`` step's output, decoded.
    """
    saga_id = f"s-{kind.name}"
    await backend.start(kind.parent, PLAN, saga_id)
    await backend.settle(saga_id)
    if kind.name == "signal":
        await backend.signal(f"{saga_id}/kid", "last", Worked(piece="signalled"), context=CHILDREN)
    elif kind.name == "event":
        await backend.publish(EVENTS, Posted(ref="p2", amount=1))  # another saga's
        await backend.publish(EVENTS, Posted(ref=PLAN.id, amount=7))
    await backend.settle(saga_id)
    summary, state = await backend.summary(kind.parent, saga_id)
    assert state.status == SagaStatus.COMPLETED, summary
    return summary, kind.parent.step_named("kid").decode_output(bytes(state.steps["kid"].output))


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
async def test_a_child_steps_output_is_its_childs_last_steps_output(kind: Kind, redis: bus.Redis) -> None:
    runner_summary, on_runner = await run(RunnerBackend(DEFINITIONS), kind)
    assert on_runner == kind.output

    with anyio.fail_after(60):
        redis_summary, on_redis = await run(RedisBackend(redis, DEFINITIONS), kind)
    assert on_redis == kind.output
    assert redis_summary == runner_summary
    for context in ("compose", CHILDREN):
        assert await dead_letters(redis, Partition(context, 0).inbox) == []
