"""Test helpers shared across suites."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import msgspec

import bus
from bus._envelope import PACKED_ITEMS, describe_packed
from bus.lowlevel import is_cluster, primaries

if TYPE_CHECKING:
    from saga import SagaWorker

T = TypeVar("T")


async def holds_within(
    check: Callable[[], bool | Awaitable[bool]], timeout: float, *, poll: float = 0.05
) -> bool:
    """Poll ``check`` until it holds; whether it did within ``timeout`` seconds.

    A bounded wait for an observable state, never a sleep standing for time passing.
    """
    with anyio.move_on_after(timeout):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return True
            await anyio.sleep(poll)
    return False


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], timeout: float, what: str, *, poll: float = 0.05
) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    if not await holds_within(check, timeout, poll=poll):
        raise AssertionError(f"timed out after {timeout}s waiting until {what}")


async def while_deciding(worker: SagaWorker, action: Awaitable[T]) -> T:
    """Run ``action`` (which waits for a decision) while ``worker`` decides its inbox."""
    result: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as tg:

        async def act() -> None:
            try:
                result.append(await action)
            except Exception as error:
                failure.append(error)

        tg.start_soon(act)
        while not (result or failure):
            await worker.run_until_idle()
    if failure:
        raise failure[0]
    return result[0]


def envelope_items(fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    """An entry's packed envelope (its ``e`` field), item by item (``bus/_envelope.py``)."""
    return dict(zip(PACKED_ITEMS, msgspec.msgpack.decode(fields[b"e"]), strict=True))


def repacked(fields: Mapping[bytes, bytes], **items: object) -> dict[bytes, bytes]:
    """``fields`` with the named items of its packed envelope replaced (by any value, of any type)."""
    changed = {**envelope_items(fields), **items}
    return {**fields, b"e": msgspec.msgpack.encode(list(changed.values()))}


def raw_entry(data: bytes | str = b"{}", **items: object) -> dict[bytes, bytes]:
    """An entry's fields packed item by item, for a test to ``XADD`` by hand.

    Items not given are an unsigned ``Charge``'s (id ``m``); any value goes, of a wrong type
    too, and :class:`msgspec.Raw` puts bytes in as they are (invalid MessagePack included).
    """
    packed = {**dict(zip(PACKED_ITEMS, _RAW_DEFAULTS, strict=True)), **items}
    data = data.encode() if isinstance(data, str) else data
    return {b"e": msgspec.msgpack.encode(list(packed.values())), b"data": data}


_RAW_DEFAULTS = (3, "m", "Charge", 1, "", "", "", "", "", 1, {}, "", "", b"")


def as_fields(envelope: bus.Envelope) -> dict[bytes, bytes]:
    """The fields ``envelope`` is written as, as Redis gives them back."""
    fields = envelope.to_fields()
    return {
        name.encode(): value if isinstance(value, bytes) else str(value).encode()
        for name, value in fields.items()
    }


async def age_pending(redis: bus.Redis, stream: bus.Stream, group: str, entry_id: str, idle_ms: int) -> None:
    """Make a pending entry look idle for ``idle_ms`` (server clock) without waiting.

    XCLAIM to its current owner with ``IDLE`` rewrites only the idle time: the test stands
    in for time passing, so no test sleeps to let a lease expire.
    """
    rows = await redis.xpending_range(stream.key, group, min=entry_id, max=entry_id, count=1)
    assert rows, f"{entry_id} is not pending in {group}"
    owner = rows[0]["consumer"].decode()
    await redis.xclaim(stream.key, group, owner, 0, [entry_id], idle=idle_ms, justid=True)


async def pending(redis: bus.Redis, stream: bus.Stream, group: str) -> list[dict[str, object]]:
    """Every pending entry of ``group`` with its owner and delivery count."""
    rows = await redis.xpending_range(stream.key, group, min="-", max="+", count=10_000)
    return [
        {
            "id": r["message_id"].decode(),
            "consumer": r["consumer"].decode(),
            "deliveries": r["times_delivered"],
        }
        for r in rows
    ]


async def dead_letters(redis: bus.Redis, stream: bus.Stream) -> list[dict[str, str]]:
    """The dead-letter stream of ``stream``'s tag, fields decoded (raw fields kept as text).

    The raw copy of a packed envelope (``raw.e``) is shown as the dead-letter tools show it,
    a JSON object of its items (:func:`raw_items` reads it back).
    """
    entries = await redis.xrange(stream.dlq_key)
    return [
        {
            k.decode(): describe_packed(v) if k == b"raw.e" else v.decode(errors="replace")
            for k, v in fields.items()
        }
        for _, fields in entries
    ]


def raw_items(letter: Mapping[str, str]) -> dict[str, Any]:
    """The packed envelope a dead letter copied, item by item (of :func:`dead_letters`, or a ``raw``)."""
    items: dict[str, Any] = msgspec.json.decode(letter["raw.e" if "raw.e" in letter else "e"])
    return items


async def until_redis_clock_passes_newest(redis: bus.Redis, stream_key: str) -> None:
    """Wait until Redis's clock is past the millisecond of the stream's newest entry.

    Trimming with a retention of 0 removes entries older than now: an entry made in the
    current millisecond is not older yet, so a test that trims at once would race the clock.
    """
    [(newest, _)] = await redis.xrevrange(stream_key, count=1)
    newest_ms = int(newest.split(b"-")[0])

    async def passed() -> bool:
        seconds, micros = await redis.time()
        return seconds * 1000 + micros // 1000 > newest_ms

    await eventually(passed, 5, "Redis's clock passed the stream's newest entry", poll=0.001)


async def keys_matching(redis: bus.Redis, pattern: str) -> list[bytes]:
    """Every key matching ``pattern``: ``KEYS`` on one server, ``SCAN`` on every master of a cluster.

    ``KEYS`` on a cluster client asks one node, so a test asserting "no key left" would pass
    on a cluster without looking at the other masters.
    """
    if is_cluster(redis):
        return await scan_keys(redis, match=pattern)
    return list(await redis.keys(pattern))


async def scan_keys(redis: bus.Redis, *, match: str | None = None, type_: str | None = None) -> list[bytes]:
    """Every key (matching ``match``, of type ``type_``) by ``SCAN``: on a cluster, master by master.

    On a cluster each master is scanned to the end on its own, its cursor read from its own
    reply: redis-py's ``scan_iter`` keys its cursors by the node names of its first reply,
    and loses one (``KeyError``) when the slot map is re-read under it, as after a failover.
    """
    if not is_cluster(redis):
        return [key async for key in redis.scan_iter(match=match, count=1000, _type=type_)]
    keys: list[bytes] = []
    for node in await primaries(redis):
        cursor = None
        while cursor != 0:
            replies, found = await redis.scan(  # type: ignore[call-arg]
                cursor=cursor or 0, match=match, count=1000, _type=type_, target_nodes=node
            )
            [cursor] = replies.values()
            keys += found
    return keys
