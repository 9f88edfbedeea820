"""The verdict on a client's start request: recorded by the orchestrator, awaited by the client.

With signing on, a client without its context's orchestrator keyring starts a saga by a
request on the inbox (:meth:`saga.SagaClient.start`). The orchestrator either creates the
saga (the verdict is the saga itself, readable by the client) or refuses the request: it
then records why under ``rs:{ctx:p}:refused:<request id>`` (expiring after
:data:`REFUSAL_TTL_MS`) before the bus dead-letters the request with the same reason. The
client, which may not read dead letters, waits for one or the other (:func:`request_start`).
"""

from __future__ import annotations

from typing import Any, Final, Literal

import anyio
import msgspec

from bus import Envelope, Publisher
from bus.lowlevel import redis_errors
from saga.core.model import SagaState
from saga.definition.saga import Saga
from saga.errors import (
    InvalidInput,
    KeyBusy,
    SagaExists,
    SagaNotFound,
    StartConflict,
    StartPending,
    VersionDrained,
)
from saga.store.branches import load_saga
from saga.store.codec import Loaded
from saga.store.keys import Partition
from saga.store.trust import inbox_audience

REFUSAL_TTL_MS: Final = 24 * 3600 * 1000
"""How long a refusal stays readable: far longer than any client waits for it."""

RefusalKind = Literal["exists", "drained", "invalid", "busy"]
"""Raised to the client as :class:`SagaExists`, :class:`VersionDrained`, :class:`InvalidInput`,
:class:`KeyBusy`."""


class Refusal(msgspec.Struct, frozen=True):
    """Why a start request was refused.

    ``kind``: ``exists`` (the id is taken by another definition or by other data),
    ``drained`` (its version takes no new sagas), ``invalid`` (its data or definition
    name) or ``busy`` (its concurrency key skips when busy, and was). ``reason`` is the
    orchestrator's message.
    """

    kind: RefusalKind
    reason: str


async def record_refusal(redis: Any, partition: Partition, request_id: str, refusal: Refusal) -> None:
    """Record ``refusal`` for the client waiting on ``request_id`` (a repeat rewrites it)."""
    with redis_errors():
        await redis.set(partition.refused_start(request_id), msgspec.json.encode(refusal), px=REFUSAL_TTL_MS)


async def await_verdict(
    redis: Any,
    partition: Partition,
    saga_id: str,
    request_id: str,
    *,
    wait_s: float,
    poll_s: float = 0.05,
) -> Loaded | Refusal | None:
    """Wait up to ``wait_s`` seconds for the saga or the refusal of request ``request_id``.

    Returns the saga as read (its data may differ from the request's: the caller judges), the
    refusal, or ``None`` when neither came in time. Real time: it waits for another process.
    """
    key = partition.refused_start(request_id)
    with anyio.move_on_after(wait_s):
        while True:
            with redis_errors():
                raw = await redis.get(key)
            if raw is not None:
                return msgspec.json.decode(raw, type=Refusal)
            loaded = await load_saga(redis, partition, saga_id)
            if loaded is not None:
                return loaded
            await anyio.sleep(poll_s)
    return None


async def request_start(
    redis: Any,
    publisher: Publisher,
    definition: Saga[Any],
    envelope: Envelope,
    *,
    partition: Partition,
    encoded: bytes,
    wait_s: float,
) -> str:
    """Send the start request ``envelope`` and wait for its verdict (``SagaClient.start``).

    An id that exists already is judged at once and nothing is sent. Each request has an id
    of its own, so no publish-dedupe record of an earlier one (lost with its saga in a lost
    AOF tail) swallows it, and no earlier refusal stands for it; a repeated start changes
    nothing (the orchestrator finds the saga).
    """
    saga_id = envelope.correlation_id
    existing = await load_saga(redis, partition, saga_id)
    if existing is not None:
        check_existing(definition, existing.state, encoded)
        return saga_id
    await publisher.publish_envelope(
        partition.inbox, envelope, audience=inbox_audience(definition.context.name)
    )
    if wait_s <= 0:
        return saga_id
    verdict = await await_verdict(redis, partition, saga_id, envelope.id, wait_s=wait_s)
    if verdict is None:
        raise StartPending(saga_id, envelope.id, wait_s)
    if isinstance(verdict, Loaded):
        check_existing(definition, verdict.state, encoded)
        return saga_id
    if verdict.kind == "drained":
        raise drained_error(definition)
    if verdict.kind == "busy":
        key = definition.concurrency.name if definition.concurrency is not None else ""
        raise KeyBusy(verdict.reason, key=key, value="")
    if verdict.kind == "exists":
        existing = await load_saga(redis, partition, saga_id)
        if existing is None:  # ended and expired since: the refusal still stands
            raise SagaNotFound(saga_id)
        check_existing(definition, existing.state, encoded)
    raise InvalidInput(f"start of saga {saga_id!r} refused: {verdict.reason}")


def drained_error(definition: Saga[Any]) -> VersionDrained:
    """The error of a start on a drained version."""
    return VersionDrained(
        f"{definition.key} is drained: new sagas may not start on it (sagas already running end "
        "on it); start the newest version, or undrain it",
        saga=definition.name,
        version=definition.version,
    )


def check_existing(definition: Saga[Any], existing: SagaState, encoded: bytes) -> None:
    """Raise unless ``existing`` is the saga a start of ``definition`` with ``encoded`` asks for."""
    if existing.name != definition.name:
        raise SagaExists(f"saga {existing.id!r} exists and runs {existing.name}@{existing.version}")
    if msgspec.json.decode(existing.data) != msgspec.json.decode(encoded):
        raise StartConflict(existing.id, f"{existing.name}@{existing.version}")
