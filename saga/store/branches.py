"""Where branch records live: a hash next to the saga hash, written by the same script.

A group step (parallel, first-of-N, map) keeps a small summary in its own ``s:<group>``
field of the saga hash -- counters and the indexes of the branches in flight, so its size
grows with the concurrency limit, never with the branch count -- and each started branch's
record (status, every attempt with its input and output) in::

    rs:{<ctx>:<p>}:branches:<saga id>    hash: '<group>#<index>' -> its record (saga/store/codec.py)

It shares the partition's hash tag, so the transition script writes it in the same atomic
commit as the saga hash (its last section; see ``saga/store/lua/transition.lua``), and a branch
change bumps the saga's revision like any other change. A commit writes only the branch
records its decision touched (the decider copies a branch record when it changes it, so
"touched" is an identity check, not a re-encoding of every branch). The hash expires with
the saga.

Loading reads both hashes in one ``MULTI`` for sagas that have group steps (one round trip
more than a saga without them, and only when the orchestrator's cache misses).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bus.lowlevel import redis_errors
from saga.core.model import SagaState, StepState
from saga.store.codec import Loaded, changed_branches, decode_state, decode_step
from saga.store.keys import Partition

__all__ = ["changed_branches", "decode_branches", "has_groups", "load_saga"]


def has_groups(state: SagaState) -> bool:
    """Whether the saga has started a group step (then it may have branch records)."""
    return bool(state.branches) or any(s.group is not None for s in state.steps.values())


def decode_branches(saga_id: str, raw: Mapping[bytes, bytes]) -> dict[str, StepState]:
    """The branch hash of saga ``saga_id`` as read (``HGETALL``), decoded."""
    return {key.decode(): decode_step(saga_id, key.decode(), value) for key, value in raw.items()}


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
    with redis_errors():  # again, with the branches, in one MULTI: one consistent revision
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(partition.saga(saga_id))
            pipe.hgetall(partition.branches(saga_id))
            raw, branches = await pipe.execute()
    if not raw:
        return None
    loaded = decode_state(saga_id, raw, context=partition.context, partition=partition.index)
    loaded.state.branches = decode_branches(saga_id, branches)
    return loaded
