"""Workers that divide a context's partitions (``EngineConfig.partitions``, ``saga worker --partitions``).

Each worker orchestrates, fires timers for and handles the participants' commands of only
the partitions it was given; two workers with disjoint halves end every saga between them.
Runs on fakeredis, real Redis and the test cluster (where the partitions are on different
masters).
"""

from __future__ import annotations

import msgspec
import pytest

import bus
from bus import FakeClock
from saga import (
    App,
    Command,
    CommandContext,
    Context,
    EngineConfig,
    Participant,
    Saga,
    SagaClient,
    SagaStatus,
    SagaWorker,
    command,
)
from saga.errors import PartitionOutOfRange
from saga.store.keys import partition_of

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
SPLIT = Context("split", partitions=4)


class Job(msgspec.Struct, frozen=True):
    id: str


class Do(msgspec.Struct, tag=True, frozen=True):
    id: str


class Done(msgspec.Struct, tag=True, frozen=True):
    id: str


job: Saga[Job] = Saga("job", context=SPLIT, data=Job)


@job.step(reply=Done)
def work(data: Job) -> Command:
    return command("doer", Do(id=data.id))


doer = Participant("doer", serves=[SPLIT])


@doer.handles(Do)
async def do(message: Do, _ctx: CommandContext) -> Done:
    return Done(id=message.id)


APP = App("split", sagas=[job], participants=[doer])


def test_a_config_names_distinct_partition_indexes() -> None:
    assert EngineConfig(partitions=(0, 2)).serves(2)
    assert not EngineConfig(partitions=(0, 2)).serves(1)
    assert EngineConfig().serves(3)
    for wrong in ((-1,), (1, 1)):
        with pytest.raises(ValueError, match="distinct indexes"):
            EngineConfig(partitions=wrong)


async def test_a_worker_refuses_partition_indexes_no_context_has(redis: bus.Redis) -> None:
    """An index at or beyond every served context's count names nothing; one below the
    largest count is fine (the smaller contexts have nothing there)."""
    with pytest.raises(PartitionOutOfRange) as refused:
        SagaWorker(redis, APP, config=EngineConfig(partitions=(1, 4, 6)))
    assert (refused.value.indexes, refused.value.partitions) == ((4, 6), {"split": 4})
    assert str(refused.value) == "no partition 4,6 to serve: 'split' has 4; give indexes from 0 to 3"
    other = Participant("other", serves=[Context("small", partitions=2)])
    other.handles(Do)(do)
    both = App("both", sagas=[job], participants=[doer, other])
    assert [p.index for p in SagaWorker(redis, both, config=EngineConfig(partitions=(3,))).partitions] == [3]


async def test_two_workers_with_disjoint_partitions_end_every_saga_between_them(redis: bus.Redis) -> None:
    clock = FakeClock()
    client = SagaClient(redis, APP.registry, clock=clock)
    ids = [f"job-{n}" for n in range(24)]
    for saga_id in ids:
        await client.start(job, Job(id=saga_id), saga_id=saga_id)
    low = SagaWorker(redis, APP, config=EngineConfig(partitions=(0, 1)), clock=clock, consumer="low")
    high = SagaWorker(redis, APP, config=EngineConfig(partitions=(2, 3)), clock=clock, consumer="high")
    assert [p.index for p in low.partitions] == [0, 1]

    await low.run_until_idle()
    statuses = {saga_id: (await client.get(saga_id)).status for saga_id in ids}
    served = {saga_id for saga_id in ids if partition_of(saga_id, SPLIT.partitions) in (0, 1)}
    assert served
    assert served != set(ids)
    assert {s for s, status in statuses.items() if status == SagaStatus.COMPLETED} == served

    await high.run_until_idle()
    assert {(await client.get(saga_id)).status for saga_id in ids} == {SagaStatus.COMPLETED}
