"""The store contract: the memory store and the Redis scripts apply decisions alike.

One suite, four backends (the in-process runner's :class:`MemoryStore`, and
:class:`RedisStore` on fakeredis, on real Redis and on a 6-node Redis Cluster): revisions
and the revision check, state and history, timers started, cancelled and fired, and the index of event waits.
Honest difference: the buffer of early events expires by the caller's clock in memory and
by Redis's own in Redis, so expiry is not part of the contract.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

import bus
from bus import Stream
from saga.core.decider import Decision
from saga.core.effects import CancelTimer, Effect, StartTimer
from saga.core.model import CancelRequested, Event, SagaState, Started
from saga.core.states import SagaStatus
from saga.store.codec import Loaded, state_write
from saga.store.commit import WatchRequest
from saga.store.keys import Partition
from saga.store.memory import MemoryStore
from saga.store.protocol import SagaStore
from saga.store.redis_store import RedisStore
from saga.store.wait_index import BufferedEvent, Waiter
from tests.cluster import flush, shared_cluster
from tests.conftest import REDIS_URL, require_server

pytestmark = pytest.mark.anyio

NOW = 1_700_000_000_000
SHOP = Partition("shop", 0)
EVENTS = Stream.named("treasury-events")
TTL_MS, CAP = 60_000, 3


@pytest.fixture(params=["memory", "fake", "real", pytest.param("cluster", marks=pytest.mark.cluster)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SagaStore]:
    """Every test runs on the memory store, and the Redis store on fakeredis, real Redis and a cluster."""
    if request.param == "memory":
        yield MemoryStore(ttl_ms=TTL_MS, cap=CAP)
        return
    if request.param == "fake":
        client = bus.connect(bus.MEMORY_URL)
    elif request.param == "cluster":
        client = bus.connect(shared_cluster().url)
        await flush(client)
    else:
        require_server("Redis", REDIS_URL)
        client = bus.connect(REDIS_URL)
        await client.flushdb()
    try:
        yield RedisStore(client, ttl_ms=TTL_MS, cap=CAP)
    finally:
        await client.aclose()


def _state(data: bytes = b'{"n":1}', status: SagaStatus = SagaStatus.RUNNING) -> SagaState:
    return SagaState(
        id="s-1",
        name="order",
        version=1,
        context="shop",
        partition=0,
        status=status,
        data=msgspec.Raw(data),
        steps={},
        created_ms=NOW,
        updated_ms=NOW,
    )


def _event(n: int) -> Event:
    if n == 0:
        return Started(id="e0", at_ms=NOW, data=msgspec.Raw(b'{"n":1}'), saga="order@1")
    return CancelRequested(id=f"e{n}", at_ms=NOW + n, by="test")


async def _commit(
    store: SagaStore, before: Loaded | None, state: SagaState, n: int, effects: list[Effect] | None = None
) -> tuple[str, int]:
    result = await store.commit(SHOP, before, Decision(state, effects or []), _event(n), now_ms=NOW)
    return result.outcome, result.revision


async def test_the_revision_moves_only_when_the_hash_changes(store: SagaStore) -> None:
    assert await store.load(SHOP, "s-1") is None
    assert await _commit(store, None, _state(), 0) == ("ok", 1)
    before = await store.load(SHOP, "s-1")
    assert before is not None
    assert before.state.revision == 1
    assert await _commit(store, before, _state(), 1) == ("ok", 1)  # the same fields: no new revision
    before = await store.load(SHOP, "s-1")
    assert await _commit(store, before, _state(b'{"n":2}'), 2) == ("ok", 2)
    after = await store.load(SHOP, "s-1")
    assert after is not None
    assert (after.state.revision, bytes(after.state.data)) == (2, b'{"n":2}')
    history = await store.history(SHOP, "s-1")
    assert [(e.event.id, e.revision) for e in history] == [("e0", 1), ("e1", 1), ("e2", 2)]


async def test_a_stale_commit_is_refused_and_writes_nothing(store: SagaStore) -> None:
    await _commit(store, None, _state(), 0)
    stale = await store.load(SHOP, "s-1")
    assert await _commit(store, stale, _state(b'{"n":2}'), 1) == ("ok", 2)
    assert await _commit(store, stale, _state(b'{"n":3}'), 2) == ("conflict", 2)
    assert await _commit(store, None, _state(), 3) == ("conflict", 2)  # "must not exist" is stale too
    loaded = await store.load(SHOP, "s-1")
    assert loaded is not None
    assert bytes(loaded.state.data) == b'{"n":2}'
    assert [e.event.id for e in await store.history(SHOP, "s-1")] == ["e0", "e1"]


def _timer(timer_id: str, *, delay_ms: int = 0, at_ms: int | None = None) -> StartTimer:
    return StartTimer(
        timer_id=timer_id, delay_ms=delay_ms, at_ms=at_ms, purpose="timeout", step="pay", kind="do", attempt=1
    )


async def test_timers_start_cancel_and_fire_once(store: SagaStore) -> None:
    effects: list[Effect] = [
        _timer("t1", delay_ms=1_000),
        _timer("t2", at_ms=NOW + 500),
        _timer("t3", delay_ms=9),
    ]
    await _commit(store, None, _state(), 0, effects)
    await _commit(store, await store.load(SHOP, "s-1"), _state(b'{"n":2}'), 1, [CancelTimer(timer_id="t3")])
    pending = await store.timers(SHOP)
    assert [(t.timer_id, t.saga_id, t.due_ms) for t in pending] == [
        ("t2", "s-1", NOW + 500),
        ("t1", "s-1", NOW + 1_000),
    ]
    assert await store.fire_due(SHOP, NOW + 499) == []
    fired = await store.fire_due(SHOP, NOW + 1_000)
    assert [t.timer_id for t in fired] == ["t2", "t1"]
    event = fired[0].fired(NOW + 1_000)
    assert (event.id, event.timer_id, event.purpose, event.step, event.kind, event.attempt) == (
        "t2", "t2", "timeout", "pay", "do", 1,
    )  # fmt: skip
    assert await store.fire_due(SHOP, NOW + 2_000) == []
    assert await store.timers(SHOP) == []


def _watch(
    saga_id: str, message_type: str = "FundsReady", *, key: str = "k", attempt: int = 0
) -> WatchRequest:
    return WatchRequest(
        saga_id=saga_id,
        partition=0,
        step="funds",
        n=1,
        stream=EVENTS.key,
        message_type=message_type,
        key=key,
        attempt=attempt,
    )


def _buffered(event_id: str, message_type: str = "FundsReady") -> BufferedEvent:
    return BufferedEvent(id=event_id, type=message_type, payload=msgspec.Raw(b"{}"))


async def test_the_event_index_gives_the_same_answers(store: SagaStore) -> None:
    """The same registrations and events in the same order: the same matches and buffered events."""
    seen: list[object] = []

    async def route(event: BufferedEvent, key: str = "k") -> None:
        seen.append([w.saga_id for w in await store.route("lending", EVENTS, event, key, NOW)])

    async def watch(request: WatchRequest) -> None:
        found = await store.watch("lending", request, NOW)
        seen.append(found.id if found else None)

    await route(_buffered("e0", "Other"))  # nobody waits: buffered
    await route(_buffered("e1"))
    await route(_buffered("e1"))  # a redelivery is buffered once
    await watch(_watch("s1"))  # finds the first buffered event of its type
    await route(_buffered("e2"))  # finds the registration, is not buffered
    await watch(_watch("s2", "Other"))
    await watch(_watch("s3", key="k2"))  # another key: nothing buffered there
    await watch(_watch("s1", attempt=2))  # a redriven wait: a registration of its own
    await route(_buffered("e3"))
    await store.unwatch("lending", _watch("s1"))
    await route(_buffered("e4"))
    await store.unwatch("lending", _watch("s1", attempt=2))
    for n in range(5, 9):  # over the cap: the oldest go
        await route(_buffered(f"e{n}"), "k3")
    await watch(_watch("s4", key="k3"))
    assert seen == [[], [], [], "e1", ["s1"], "e0", None, "e1", ["s1", "s1"], ["s1"], [], [], [], [], "e6"]


async def test_a_waiter_is_what_its_registration_registered(store: SagaStore) -> None:
    await store.watch("lending", _watch("s1"), NOW)
    assert await store.route("lending", EVENTS, _buffered("e1"), "k", NOW) == [
        Waiter(saga_id="s1", partition=0, step="funds", n=1)
    ]


def test_state_write_is_the_one_revision_rule() -> None:
    before = _state()
    fields = state_write(None, None, before, changed=True).fields
    assert state_write(before, fields, _state(), changed=True).revision == 0  # nothing differs
    assert state_write(before, fields, _state(b"{}"), changed=True).revision == 1
    assert state_write(before, fields, _state(b"{}"), changed=False).revision == 0  # ignored
