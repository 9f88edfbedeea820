"""The saga runtime on Redis (fakeredis and real): commits, fencing, bad input."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
import pytest

import bus
from bus import FakeClock
from bus.lowlevel import CommandCall, ScriptCall
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import app
from saga import EngineConfig, InvalidInput, SagaClient, SagaStatus, SagaWorker
from saga.core import decider
from saga.core.decider import decide
from saga.core.model import SagaState, Started, StepReplied
from saga.store.codec import decode_state
from saga.store.commit import CommitResult, commit_call, commit_result
from saga.store.keys import Partition
from tests.helpers import dead_letters, keys_matching, pending

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
ORDER = Order(id="o1", customer="c1", lines=[Line(sku="s", quantity=1)], total_cents=100)
PARTITION = Partition("orders", 0)
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))


async def stored(redis: bus.Redis, saga_id: str) -> dict[bytes, bytes]:
    return await redis.hgetall(PARTITION.saga(saga_id))


async def test_start_is_idempotent_by_saga_id(redis: bus.Redis) -> None:
    client = SagaClient(redis, app.registry)
    first = await client.start(order_fulfilment, ORDER, saga_id="order-o1")
    again = await client.start(order_fulfilment, ORDER, saga_id="order-o1")
    assert first == again == "order-o1"
    assert await redis.xlen(PARTITION.commands("inventory").key) == 1
    assert (await client.get("order-o1")).revision == 1


async def test_start_with_invalid_data_stores_nothing(redis: bus.Redis) -> None:
    client = SagaClient(redis, app.registry)
    with pytest.raises(InvalidInput, match="not a valid Order"):
        await client.start(order_fulfilment, {"id": "o1"}, saga_id="bad")
    with pytest.raises(InvalidInput, match="not a valid Order"):
        await client.start(order_fulfilment, ORDER.__class__, saga_id="bad")
    assert await keys_matching(redis, "*") == []


def stock_reserved(state: SagaState) -> StepReplied:
    """The reply to the saga's first command."""
    return StepReplied(
        id="r1",
        at_ms=1,
        step="reserve_stock",
        kind="do",
        attempt=1,
        command_id=state.steps["reserve_stock"].attempts[0].command_id,
        ok=True,
        output=msgspec.Raw(b'{"type":"StockReserved","reservation_id":"r"}'),
    )


async def test_a_stale_decision_cannot_commit(redis: bus.Redis) -> None:
    """A worker that decided on an old revision is refused; nothing it decided is written."""
    client = SagaClient(redis, app.registry)
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    stale = decode_state("s1", await stored(redis, "s1"), context="orders", partition=0)
    reply = stock_reserved(stale.state)
    decision = decide(order_fulfilment, stale.state, reply)
    call, _ = commit_call(
        PARTITION, stale, decision, reply, delivery=None, now_ms=1, timer_now_ms=-1, retention_s=0
    )
    assert commit_result(await call.run(redis)).outcome == "ok"
    commands_before = await redis.xlen(PARTITION.commands("payments").key)

    # a second worker still holding the old state decides the same reply again
    decision_again = decide(order_fulfilment, stale.state, reply)
    call, _ = commit_call(
        PARTITION, stale, decision_again, reply, delivery=None, now_ms=1, timer_now_ms=-1, retention_s=0
    )
    result = commit_result(await call.run(redis))
    assert result.outcome == "conflict"
    assert result.revision == 2
    assert await redis.xlen(PARTITION.commands("payments").key) == commands_before


async def test_a_copy_of_a_lost_revision_cannot_commit_onto_its_remake(redis: bus.Redis) -> None:
    """Redis lost a transition (an AOF tail, a failover) and another commit made its revision
    again: a worker that cached the lost revision must be refused, not merge its field diff
    into the new state (the revision number alone is the same)."""
    client = SagaClient(redis, app.registry)
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    first = decode_state("s1", await stored(redis, "s1"), context="orders", partition=0)
    before_loss = await redis.dump(PARTITION.saga("s1"))
    reply = stock_reserved(first.state)
    decision = decide(order_fulfilment, first.state, reply)
    call, cached = commit_call(
        PARTITION, first, decision, reply, delivery=None, now_ms=1, timer_now_ms=-1, retention_s=0
    )
    result = commit_result(await call.run(redis))
    assert result.outcome == "ok"
    cached.state.revision = result.revision  # what a worker's cache now holds: revision 2

    await redis.restore(PARTITION.saga("s1"), 0, before_loss, replace=True)  # revision 2 is lost
    again = msgspec.structs.replace(
        reply, id="r2", output=msgspec.Raw(b'{"type":"StockReserved","reservation_id":"x"}')
    )
    fresh = decode_state("s1", await stored(redis, "s1"), context="orders", partition=0)
    call, _ = commit_call(
        PARTITION, fresh, decide(order_fulfilment, fresh.state, again), again,
        delivery=None, now_ms=1, timer_now_ms=-1, retention_s=0,
    )  # fmt: skip
    assert commit_result(await call.run(redis)) == CommitResult("ok", 2)  # revision 2 again, other content

    late = decide(order_fulfilment, cached.state, reply)  # any decision on the cached copy
    call, _ = commit_call(
        PARTITION, cached, late, reply, delivery=None, now_ms=2, timer_now_ms=-1, retention_s=0
    )
    assert commit_result(await call.run(redis)).outcome == "conflict"


async def test_a_worker_that_lost_its_inbox_lease_cannot_commit(redis: bus.Redis) -> None:
    client = SagaClient(redis, app.registry)
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    loaded = decode_state("s1", await stored(redis, "s1"), context="orders", partition=0)
    await redis.xgroup_create(PARTITION.inbox.key, "orchestrator", id="0", mkstream=True)
    await client.cancel("s1", reason="test")
    [[_, [(entry_id, fields)]]] = await redis.xreadgroup("orchestrator", "old", {PARTITION.inbox.key: ">"})
    await redis.xclaim(PARTITION.inbox.key, "orchestrator", "new", 0, [entry_id])  # lease moved on
    envelope = bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32)
    from saga.runtime.protocol import to_event

    event = to_event(envelope)
    delivery = bus.Delivery(
        envelope=envelope,
        stream=PARTITION.inbox,
        group="orchestrator",
        entry_id=entry_id.decode(),
        deliveries=1,
        consumer="old",
    )
    decision = decide(order_fulfilment, loaded.state, event)
    call, _ = commit_call(
        PARTITION, loaded, decision, event, delivery=delivery, now_ms=1, timer_now_ms=-1, retention_s=0
    )
    assert commit_result(await call.run(redis)).outcome == "lost"
    assert (await client.get("s1")).revision == 1  # nothing written
    assert (await pending(redis, PARTITION.inbox, "orchestrator"))[0]["consumer"] == "new"


Calls = list[ScriptCall | CommandCall]


async def cancel_request(
    redis: bus.Redis, client: SagaClient, consumer: str, call_many: Callable[..., Awaitable[list[object]]]
) -> bus.Delivery:
    """Start s1, cancel it, and read the cancel request from the inbox as ``consumer``.

    The delivery's calls go to ``call_many`` (where a worker would batch them)."""
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    await redis.xgroup_create(PARTITION.inbox.key, "orchestrator", id="0", mkstream=True)
    await client.cancel("s1", reason="test")
    [[_, [(entry_id, fields)]]] = await redis.xreadgroup("orchestrator", consumer, {PARTITION.inbox.key: ">"})
    return bus.Delivery(
        envelope=bus.decode_fields(fields, max_bytes=1 << 20, max_fields=32),
        stream=PARTITION.inbox,
        group="orchestrator",
        entry_id=entry_id.decode(),
        deliveries=1,
        consumer=consumer,
        _call_many=call_many,
    )


@pytest.mark.parametrize("noticed", [False, True], ids=["told-by-the-script", "told-by-the-lease-keeper"])
async def test_the_orchestrator_drops_an_entry_whose_lease_moved_on(redis: bus.Redis, noticed: bool) -> None:
    """The commit is refused (or, once the lease keeper noticed, not even sent): LeaseLost,
    which the bus turns into an abandoned handler; the saga is untouched."""
    client = SagaClient(redis, app.registry)
    sent: Calls = []

    async def run_each(calls: Calls, retry: bool = True) -> list[object]:
        del retry
        sent.extend(calls)
        return [await call.run(redis) for call in calls]

    delivery = await cancel_request(redis, client, "old", run_each)
    await redis.xclaim(PARTITION.inbox.key, "orchestrator", "new", 0, [delivery.entry_id])  # lease moved on
    if noticed:
        delivery.scope.cancel()
    worker = SagaWorker(redis, app, config=CONFIG)
    [outcome] = await worker.orchestrators[0].on_inbox_batch([(delivery.envelope, delivery)])
    assert isinstance(outcome, bus.LeaseLost)
    assert (await client.get("s1")).revision == 1
    assert (await pending(redis, PARTITION.inbox, "orchestrator"))[0]["consumer"] == "new"
    assert not delivery.acked_by_handler
    commits = [call for call in sent if isinstance(call, ScriptCall)]
    assert len(commits) == (0 if noticed else 1)


async def test_an_entry_whose_saga_cannot_be_read_fails_alone_and_stays_pending(redis: bus.Redis) -> None:
    """A load that fails (Redis unreachable) is that entry's transient failure: the bus
    retries it later; nothing is decided or written."""
    client = SagaClient(redis, app.registry)

    async def unreachable(calls: Calls, retry: bool = True) -> list[object]:
        assert not retry  # loads are not retried by the completer: the entry is
        return [bus.RedisUnavailable("connection refused")] * len(calls)

    delivery = await cancel_request(redis, client, "w", unreachable)
    worker = SagaWorker(redis, app, config=CONFIG)
    [outcome] = await worker.orchestrators[0].on_inbox_batch([(delivery.envelope, delivery)])
    assert isinstance(outcome, bus.RedisUnavailable)
    assert (await client.get("s1")).revision == 1
    assert [e["consumer"] for e in await pending(redis, PARTITION.inbox, "orchestrator")] == ["w"]


async def worker_and_client(redis: bus.Redis) -> tuple[SagaWorker, SagaClient, FakeClock]:
    clock = FakeClock()
    return (
        SagaWorker(redis, app, config=CONFIG, clock=clock),
        SagaClient(redis, app.registry, clock=clock),
        clock,
    )


@pytest.mark.parametrize(
    ("reply_type", "payload", "reason"),
    [
        ("Refund", b"{}", "expects a StockReserved reply, got Refund"),
        ("StockReserved", b'{"reservation_id": 5}', "reply is not a valid StockReserved"),
        ("StockReserved", b"not json", "reply is not a valid StockReserved"),
    ],
)
async def test_a_bad_reply_is_dead_lettered_and_the_saga_keeps_waiting(
    redis: bus.Redis, reply_type: str, payload: bytes, reason: str
) -> None:
    worker, client, _ = await worker_and_client(redis)
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    state = await client.get("s1")
    attempt = state.steps["reserve_stock"].attempts[0]
    await worker.bus_worker.setup()
    reply = bus.Envelope(
        id="bad-1",
        type=reply_type,
        payload=payload,
        created_at_ms=1,
        correlation_id="s1",
        causation_id=attempt.command_id,
        headers={"step": "reserve_stock", "kind": "do", "inc": str(state.created_ms)},
    )
    await redis.xadd(PARTITION.inbox.key, reply.to_fields())  # type: ignore[arg-type]
    for fields in await redis.xrange(PARTITION.commands("inventory").key):  # keep the participant out of it
        await redis.xdel(PARTITION.commands("inventory").key, fields[0])
    await worker.run_until_idle()

    [letter] = await dead_letters(redis, PARTITION.inbox)
    assert reason in letter["reason"]
    assert letter["correlation_id"] == "s1"
    after = await client.get("s1")
    assert after.status == SagaStatus.RUNNING
    assert after.revision == state.revision


@pytest.mark.parametrize(
    "fields",
    [
        bus.Envelope(
            id="x",
            type="StockReserved",
            payload=b"{}",
            correlation_id="nobody",
            causation_id="c",
            headers={"step": "reserve_stock", "kind": "do"},
        ).to_fields(),
        bus.Envelope(id="x", type="StockReserved", payload=b"{}", correlation_id="s1").to_fields(),
        bus.Envelope(id="x", type="TimerFired", payload=b'{"timer_id": 1}', correlation_id="s1").to_fields(),
        {"garbage": "1"},
    ],
    ids=["unknown-saga", "reply-without-headers", "bad-timer", "not-an-envelope"],
)
async def test_malformed_inbox_entries_are_dead_lettered(
    redis: bus.Redis, fields: dict[str, bytes | str | int]
) -> None:
    worker, client, _ = await worker_and_client(redis)
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    await worker.bus_worker.setup()
    await redis.xadd(PARTITION.inbox.key, fields)  # type: ignore[arg-type]
    await worker.run_until_idle()
    letters = await dead_letters(redis, PARTITION.inbox)
    assert len(letters) == 1
    assert (await client.get("s1")).status == SagaStatus.COMPLETED  # the saga was not disturbed


async def test_reply_for_an_unknown_step_is_recorded_and_ignored(redis: bus.Redis) -> None:
    worker, client, _ = await worker_and_client(redis)
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    await worker.bus_worker.setup()
    created = (await client.get("s1")).created_ms
    reply = bus.Envelope(
        id="x",
        type="Whatever",
        payload=b"{}",
        correlation_id="s1",
        causation_id="c",
        headers={"step": "no_such_step", "kind": "do", "inc": str(created)},
    )
    await redis.xadd(PARTITION.inbox.key, reply.to_fields())  # type: ignore[arg-type]
    await worker.run_until_idle()
    history = await redis.lrange(PARTITION.history("s1"), 0, -1)
    assert any(b"no step 'no_such_step'" in h for h in history)
    assert (await client.get("s1")).status == SagaStatus.COMPLETED


async def test_timeouts_retry_and_a_late_reply_changes_nothing(redis: bus.Redis) -> None:
    worker, client, clock = await worker_and_client(redis)
    await client.start(order_fulfilment, ORDER, saga_id="s1")
    inventory = PARTITION.commands("inventory")
    [(first_id, _)] = await redis.xrange(inventory.key)
    await redis.xdel(inventory.key, first_id)  # the participant never sees attempt 1
    await worker.run_until_idle()
    assert (await client.get("s1")).steps["reserve_stock"].status == "dispatched"

    clock.advance(31)  # past the 30 s step timeout
    await worker.run_until_idle()  # timeout -> retry timer
    clock.advance(1)
    await worker.run_until_idle()  # attempt 2 -> the rest of the saga
    state = await client.get("s1")
    assert state.status == SagaStatus.COMPLETED
    attempts = state.steps["reserve_stock"].attempts
    assert [(a.n, a.outcome) for a in attempts] == [(1, "timeout"), (2, "ok")]
    assert "no reply within 30s" in (attempts[0].error or "")


async def test_an_unfinished_sagas_index_score_is_when_it_last_moved(redis: bus.Redis) -> None:
    """One index per status, scored by the last move: ``--stuck-for`` reads the unfinished
    statuses' indexes, and no second index is written on every transition."""
    await SagaClient(redis, app.registry).start(order_fulfilment, ORDER, saga_id="s1")
    started = await redis.zscore(PARTITION.by_status("running"), "s1")
    assert started is not None
    loaded = decode_state("s1", await stored(redis, "s1"), context="orders", partition=0)
    reply = stock_reserved(loaded.state)
    moved = int(started) + 5_000
    call, _ = commit_call(
        PARTITION, loaded, decide(order_fulfilment, loaded.state, reply), reply,
        delivery=None, now_ms=moved, timer_now_ms=moved, retention_s=0,
    )  # fmt: skip
    assert commit_result(await call.run(redis)).outcome == "ok"
    assert await redis.zscore(PARTITION.by_status("running"), "s1") == moved
    assert await keys_matching(redis, "*:active") == []


async def test_each_transition_declares_the_keys_it_touches_and_no_other(redis: bus.Redis) -> None:
    """The script tells from its arguments which keys it touches, by the rules the commit
    declares them with: each shape of the demo saga's transitions, pinned, and what each
    key received."""
    each = (
        PARTITION.saga("s1"),
        PARTITION.history("s1"),
        PARTITION.timers,
        PARTITION.timer_data,
    )  # a timeout moves
    start = Started(id="e1", at_ms=1, data=msgspec.Raw(msgspec.json.encode(ORDER)), by="client")
    decision = decider.start(order_fulfilment, "s1", bytes(start.data), 0, start)
    call, loaded = commit_call(
        PARTITION, None, decision, start, delivery=None, now_ms=1, timer_now_ms=-1, retention_s=60
    )
    assert call.keys == (
        *each, PARTITION.counts, PARTITION.by_status("running"), PARTITION.drained,
        PARTITION.commands("inventory").key,
    )  # fmt: skip
    expected = [
        ("payments", (PARTITION.by_status("running"), PARTITION.commands("payments").key)),
        ("shipping", (PARTITION.by_status("running"), PARTITION.commands("shipping").key)),
        (
            "",
            (
                PARTITION.counts,
                PARTITION.by_status("running"),
                PARTITION.by_status("completed"),
                PARTITION.ending,
                PARTITION.ends,
            ),
        ),
    ]
    for step, (participant, touched) in zip(order_fulfilment.steps, expected, strict=True):
        loaded.state.revision = commit_result(await call.run(redis)).revision
        attempt = loaded.state.steps[step.name].attempts[0]
        reply = StepReplied(
            id=f"r-{step.name}", at_ms=2, step=step.name, kind="do", attempt=1,
            command_id=attempt.command_id, ok=True, output=msgspec.Raw(b'{"type":"Done"}'),
        )  # fmt: skip
        call, loaded = commit_call(
            PARTITION, loaded, decide(order_fulfilment, loaded.state, reply), reply,
            delivery=None, now_ms=2, timer_now_ms=-1, retention_s=60,
        )  # fmt: skip
        assert call.keys == (*each, *touched), participant
    assert commit_result(await call.run(redis)).outcome == "ok"
    assert await redis.hgetall(PARTITION.counts) == {
        b"order_fulfilment@1|running": b"0",
        b"order_fulfilment@1|completed": b"1",
    }
    assert await redis.zscore(PARTITION.by_status("running"), "s1") is None
    assert await redis.zscore(PARTITION.by_status("completed"), "s1") is not None
    assert await redis.zrange(PARTITION.ending, 0, -1) == [b"order_fulfilment@1|completed|s1"]
    assert [fields for _, fields in await redis.xrange(PARTITION.ends)] == [
        {b"saga": b"s1", b"status": b"completed"}
    ]
    assert await redis.zcard(PARTITION.timers) == 0


@pytest.mark.parametrize("change", ["left out", "added", "appended"])
async def test_a_transition_given_other_keys_than_its_own_writes_nothing(
    redis: bus.Redis, change: str
) -> None:
    """A call with a key more or less than its arguments say it touches (a bug) is refused
    before it writes, never run with each key playing its neighbour's part."""
    await SagaClient(redis, app.registry).start(order_fulfilment, ORDER, saga_id="s1")
    loaded = decode_state("s1", await stored(redis, "s1"), context="orders", partition=0)
    reply = stock_reserved(loaded.state)
    call, _ = commit_call(
        PARTITION, loaded, decide(order_fulfilment, loaded.state, reply), reply,
        delivery=None, now_ms=1, timer_now_ms=-1, retention_s=0,
    )  # fmt: skip
    keys = list(call.keys)
    if change == "left out":
        keys.remove(PARTITION.timer_data)
    elif change == "added":
        keys.insert(4, PARTITION.counts)
    else:
        keys.append(PARTITION.by_status("failed"))
    with pytest.raises(bus.RedisCommandError, match="do not match"):
        await ScriptCall(call.script, tuple(keys), call.args).run(redis)
    assert (await SagaClient(redis, app.registry).get("s1")).revision == 1
    assert await redis.xlen(PARTITION.commands("payments").key) == 0
