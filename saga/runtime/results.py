"""Waiting for a saga's end: ``SagaClient.wait`` and ``SagaClient.result``.

The transition that ends a saga (or dead-letters it) adds one entry to its partition's
``ends`` stream in the same script (``saga/store/lua/transition.lua``). A waiter notes the
stream's last id, then reads the saga: if it has not ended, every end after that id is on
the stream, so the waiter blocks on ``XREAD`` from there and reads the saga again only when
an entry names it. Nothing is polled: an idle waiter sends one blocking read per
``BusConfig.block_ms`` (a read may not outlast the socket timeout).

The stream keeps about the last 1,000 ends and a read takes :data:`READ_COUNT`; a full read
means the waiter is behind and its own entry may have been trimmed, so it reads the saga
again then too.
"""

from __future__ import annotations

import math
from typing import Any, Final

import anyio
import msgspec

from bus.lowlevel import redis_errors
from saga.core.group_rules import completed_output
from saga.core.model import SagaState
from saga.core.states import SETTLED, SagaStatus
from saga.definition.registry import Registry
from saga.errors import (
    ResultTimeout,
    SagaCancelled,
    SagaCompensated,
    SagaDeadLettered,
    SagaEnded,
    SagaFailed,
    SagaNotFound,
    UnknownDefinition,
)
from saga.runtime.config import EngineConfig
from saga.store.branches import load_saga
from saga.store.keys import Partition, check_saga_id, partition_of

READ_COUNT: Final = 100
"""Entries one read of the ``ends`` stream takes (well below the 1,000 the stream keeps)."""

ENDED: Final[dict[SagaStatus, type[SagaEnded]]] = {
    SagaStatus.FAILED: SagaFailed,
    SagaStatus.COMPENSATED: SagaCompensated,
    SagaStatus.CANCELLED: SagaCancelled,
    SagaStatus.DEAD_LETTERED: SagaDeadLettered,
}
"""The error :meth:`SagaResults.result` raises for each end but ``completed``."""


class SagaResults:
    """``wait`` and ``result``, the part of :class:`~saga.SagaClient` that waits for ends."""

    redis: Any
    registry: Registry
    config: EngineConfig

    async def wait(
        self,
        saga_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - it raises ResultTimeout, with the saga's status
        context: str | None = None,
    ) -> SagaState:
        """Wait until the saga ends or is dead-lettered; return its state then.

        Returns at once when it has. ``timeout`` is in seconds (``None``: as long as it
        takes); when it runs out :class:`~saga.errors.ResultTimeout` is raised and the saga
        goes on. :class:`~saga.SagaNotFound` if there is no such saga (or it ended and
        expired). Cancelling the call (a task group, ``anyio.fail_after``) ends the wait.
        """
        ctx = self.registry.context(context)
        partition = Partition(ctx.name, partition_of(check_saga_id(saga_id), ctx.partitions))
        return await wait_settled(
            self.redis, partition, saga_id, timeout_s=timeout, block_ms=self.config.bus.block_ms
        )

    async def result(
        self,
        saga_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - as wait's
        context: str | None = None,
    ) -> Any:
        """Wait for the saga's end (as :meth:`wait` does); return its output if it completed.

        The output is its last step's, decoded as that step's output type (what a parent
        saga gets from a child); without the definition in this client's registry, as JSON
        values. Any other end raises its :class:`~saga.errors.SagaEnded`:
        :class:`~saga.errors.SagaFailed`, :class:`~saga.errors.SagaCompensated`,
        :class:`~saga.errors.SagaCancelled` or :class:`~saga.errors.SagaDeadLettered`, with
        the saga's id, definition, the step and reason of its last note, and its state.
        """
        state = await self.wait(saga_id, timeout=timeout, context=context)
        if state.status != SagaStatus.COMPLETED:
            raise ENDED[state.status](state)
        return output_of(self.registry, state)


async def wait_settled(
    redis: Any, partition: Partition, saga_id: str, *, timeout_s: float | None, block_ms: int
) -> SagaState:
    """The saga's state once it is in one of :data:`~saga.core.states.SETTLED` (see the module)."""
    deadline = math.inf if timeout_s is None else anyio.current_time() + timeout_s
    with redis_errors():
        last = await redis.xrevrange(partition.ends, count=1)
    cursor = last[0][0] if last else b"0-0"  # before the read: an end after it is on the stream
    state = await _read(redis, partition, saga_id)
    wanted = saga_id.encode()
    while state.status not in SETTLED:
        remaining_ms = (deadline - anyio.current_time()) * 1000
        if remaining_ms <= 0:
            raise ResultTimeout(saga_id, state.status.value, timeout_s or 0.0)
        block = max(1, math.ceil(min(block_ms, remaining_ms)))  # BLOCK 0 would wait for ever
        with redis_errors():
            reply = await redis.xread({partition.ends: cursor}, count=READ_COUNT, block=block)
        entries = reply[0][1] if reply else []
        if not entries:
            continue
        cursor = entries[-1][0]
        if len(entries) == READ_COUNT or any(fields.get(b"saga") == wanted for _, fields in entries):
            state = await _read(redis, partition, saga_id)
    return state


async def _read(redis: Any, partition: Partition, saga_id: str) -> SagaState:
    loaded = await load_saga(redis, partition, saga_id)
    if loaded is None:
        raise SagaNotFound(saga_id)
    return loaded.state


def output_of(registry: Registry, state: SagaState) -> Any:
    """A completed saga's output: its last step's, decoded by the definition when it is here."""
    try:
        definition = registry.get(state.name, state.version)
    except UnknownDefinition:
        last = state.completed[-1] if state.completed else None
        return None if last is None else msgspec.json.decode(bytes(state.steps[last].output))
    names = [s.name for s in definition.steps if s.name in state.steps]
    if not names:
        return None
    return definition.step_named(names[-1]).decode_output(completed_output(definition, state, names[-1]))
