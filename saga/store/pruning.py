"""Retention: forget ended sagas whose hash has expired.

An ended saga's hash and history expire by themselves (``EngineConfig.retention_s``), but
its entry in the status index and its share of the per-version counters are plain members
and numbers, and its human tasks (their hashes, index entries and timers) and task log have
no expiry of their own: ``saga/store/lua/prune_ended.lua`` removes them once the hash is
gone, so listings, ``saga stats``, the task inbox and Redis memory stay bounded however many
sagas ever ran.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any, Final

from bus import BusError, Clock
from bus.lowlevel import run_batch
from saga.core.task_rules import Stage
from saga.store.keys import Partition
from saga.store.scripts import PRUNE_ENDED

_STAGES: Final = typing.get_args(Stage)


async def prune_ended(redis: Any, partitions: Sequence[Partition], clock: Clock, batch: int = 500) -> int:
    """Forget every ended saga of ``partitions`` whose hash has expired; return how many."""
    forgotten = 0
    pending = list(partitions)
    while pending:
        now = clock.script_now_ms()
        calls = [
            PRUNE_ENDED.call(
                [p.ending, p.counts, p.task_timers, p.task_tokens],
                [now, batch, p.saga_prefix, p.status_prefix, *p.task_prefixes, *_STAGES],
            )
            for p in pending
        ]
        full = []
        for partition, result in zip(pending, await run_batch(redis, calls), strict=True):
            if isinstance(result, BusError):
                raise result
            forgotten += int(result[0])
            if int(result[1]) >= batch:
                full.append(partition)
        pending = full
    return forgotten
