"""Where branch records live: a hash next to the saga hash, written by the same script.

A group step (parallel, first-of-N, map) keeps a small summary in its own ``s:<group>``
field of the saga hash -- counters and the indexes of the branches in flight, so its size
grows with the concurrency limit, never with the branch count -- and each started branch's
record (status, every attempt with its input and output) in::

    rs:{<ctx>:<p>}:branches:<saga id>    hash: '<group>#<index>' -> its record (saga/store/records.py)

It shares the partition's hash tag, so the transition script writes it in the same atomic
commit as the saga hash (its last section; see ``saga/store/lua/transition.lua``), and a branch
change bumps the saga's revision like any other change. A commit writes only the branch
records its decision touched (the decider copies a branch record when it changes it, so
"touched" is an identity check, not a re-encoding of every branch). The hash expires with
the saga.

Loading reads both hashes together for sagas that have group steps (one round trip more
than a saga without them, and only when the orchestrator's cache misses). Together means
one pipeline that reads the saga's ``rev`` and ``tag`` again after the other keys: when they
are unchanged, no commit came between the reads (every commit that changes the saga or a
branch moves them). Not ``MULTI``: a Redis Cluster client has no transactions, and this
works on one server and on a cluster alike (every key read shares the saga's hash tag).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from bus.lowlevel import redis_errors
from saga.core.model import SagaState, StepState
from saga.store.codec import Loaded, changed_branches, decode_state
from saga.store.keys import Partition
from saga.store.records import decode_step

__all__ = ["changed_branches", "decode_branches", "has_groups", "load_saga", "read_together", "timer_pending"]
READ_ATTEMPTS: Final = 5
"""Reads :func:`read_together` tries while commits keep landing between them."""


def has_groups(state: SagaState) -> bool:
    """Whether the saga has started a group step (then it may have branch records)."""
    return bool(state.branches) or any(s.group is not None for s in state.steps.values())


def decode_branches(saga_id: str, raw: Mapping[bytes, bytes]) -> dict[str, StepState]:
    """The branch hash of saga ``saga_id`` as read (``HGETALL``), decoded."""
    return {key.decode(): decode_step(saga_id, key.decode(), value) for key, value in raw.items()}


async def timer_pending(redis: Any, partition: Partition, timer_id: str) -> bool:
    """Whether ``partition``'s timer ``timer_id`` is still waiting to be fired.

    The script that fires a timer removes it in the step that adds its entry to the inbox,
    so an entry that names a timer still waiting was not added by the scheduler.
    """
    with redis_errors():
        return await redis.zscore(partition.timers, timer_id) is not None


async def load_saga(
    redis: Any, partition: Partition, saga_id: str, raw: Mapping[bytes, bytes] | None = None
) -> Loaded | None:
    """The saga as stored, with its branch records (``None`` if there is no such saga).

    ``raw`` is the saga hash when the caller read it already (the orchestrator pipelines
    that read with its commits); a saga with groups is read again with its branches.
    """
    if raw is None:
        with redis_errors():
            raw = await redis.hgetall(partition.saga(saga_id))
    if not raw:
        return None
    loaded = decode_state(saga_id, raw, context=partition.context, partition=partition.index)
    if not has_groups(loaded.state):
        return loaded
    raw, branches = await read_together(
        redis, partition.saga(saga_id), [("HGETALL", partition.branches(saga_id))]
    )
    if not raw:
        return None
    loaded = decode_state(saga_id, raw, context=partition.context, partition=partition.index)
    loaded.state.branches = decode_branches(saga_id, branches)
    return loaded


async def read_together(redis: Any, saga_key: str, reads: Sequence[tuple[str, ...]]) -> list[Any]:
    """The saga hash and ``reads`` of keys under its tag, as of one revision.

    One pipeline: ``HGETALL`` of the saga, the reads, then the saga's ``rev`` and ``tag``
    again; when those moved (a commit came between), the pipeline is sent again, up to
    :data:`READ_ATTEMPTS` times. The last read is returned even then: a caller that commits
    is fenced by the commit's revision check, and a view shows a saga that moves anyway.
    """
    replies: list[Any] = []
    for _ in range(READ_ATTEMPTS):
        with redis_errors():
            async with redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(saga_key)
                for read in reads:
                    pipe.execute_command(*read)
                pipe.hmget(saga_key, ["rev", "tag"])
                *replies, after = await pipe.execute()
        raw = replies[0]
        if [raw.get(b"rev"), raw.get(b"tag")] == after:
            break
    return replies
