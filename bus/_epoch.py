"""The epoch check: a worker notices when Redis came back without its data (docs/faults.md, item 8).

A Redis restarted without persistence, a ``FLUSHALL``, or a failover to an empty replica
all look like an empty, healthy server: reads find no groups (which a worker would
recreate) and no sagas, so consumption would go on silently over nothing. The key
``rs:epoch`` holds an id written once, when the first worker of a deployment starts
(a brand-new deployment needs no ceremony). Every worker remembers the id it joined and
checks it every ``BusConfig.epoch_check_ms`` and before it recreates a vanished consumer
group. When the key is gone, the worker leaves the marker ``lost:<epoch>`` in its place and
stops with :class:`~bus.RedisDataLost`; a worker that may only read the key (a participant's
ACL user: ``create=False``/``mark=False``) waits for the first orchestrator to create it,
and stops without leaving the marker; workers started later find the marker and refuse
too, until an operator runs ``saga epoch accept`` (:func:`accept_epoch`): after restoring a
backup, or deciding to go on with what is left. A Redis emptied while no worker ran is not
detected: nothing remembers the epoch then.

On a Redis Cluster ``rs:epoch`` is on one master, and another master that restarts empty
would go unnoticed. So the epoch is copied to :data:`COPIES` more keys, ``rs:{epoch:<n>}``,
one in each 1/64 of the slot space (so every master of a cluster whose masters serve ranges
of 256 slots or more holds one; the copies move with their slots when it is resharded). The first worker of a
deployment writes them with the epoch; a worker joining later checks them; every check
looks at each: a copy gone means its master lost its data, and ``rs:epoch`` is marked lost as
when it vanishes itself. ``saga epoch accept`` rewrites them. Only writers of the epoch
(orchestrators) touch the copies; a participant checks ``rs:epoch`` alone.
"""

from __future__ import annotations

from typing import Final

from bus._client import Redis
from bus._cluster import is_cluster, slot_of
from bus._errors import BusError, EpochNotSet, RedisDataLost, redis_errors
from bus._scripts import Script, run_batch
from redsaga.ids import uuid7
from redsaga.streams import PREFIX

EPOCH_KEY: Final = f"{PREFIX}:epoch"
SLOTS: Final = 16384
COPIES: Final = 64
"""Copies of the epoch on a cluster: one in each 1/64 of the slot space."""


def _spread_copies() -> tuple[str, ...]:
    """For each of :data:`COPIES` equal ranges of slots, the first ``rs:{epoch:<n>}`` in it."""
    width, found, n = SLOTS // COPIES, dict[int, str](), 0
    while len(found) < COPIES:
        key = f"{PREFIX}:{{epoch:{n}}}"
        found.setdefault(slot_of(key) // width, key)
        n += 1
    return tuple(found[index] for index in range(COPIES))


EPOCH_COPIES: Final = _spread_copies()
"""The keys of the copies: a master serving any 256 contiguous slots holds one."""
EPOCH_COPY_PATTERN: Final = f"{PREFIX}:{{epoch:*}}"
"""A glob matching every copy (the orchestrators' ACL pattern)."""
_EPOCH: Final = Script.load("bus", "epoch")


async def join_epoch(redis: Redis, *, create: bool = True) -> str:
    """The deployment's epoch (created if the key is absent); raise if marked lost.

    With ``create`` false the key is only read: an absent key raises :class:`EpochNotSet`
    (retryable: the first orchestrator's worker sets it).
    """
    if not create:
        found = await read_epoch(redis)
        if found is None:
            raise EpochNotSet
        if found.startswith("lost:"):
            raise RedisDataLost(expected=None, found=found)
        return found
    fresh = uuid7()
    status, value = map(_text, await _EPOCH(redis, [EPOCH_KEY], ["join", fresh]))
    if status == "lost":
        raise RedisDataLost(expected=None, found=value)
    if is_cluster(redis):
        if value == fresh:  # a new deployment: its copies are written now
            await _copies(redis, "accept", value)
        else:
            await check_epoch(redis, value)
    return value


async def check_epoch(redis: Redis, joined: str, *, mark: bool = True) -> None:
    """Raise :class:`~bus.RedisDataLost` unless ``rs:epoch`` still holds ``joined``.

    With ``mark`` false nothing is written (a missing key is not marked lost).
    """
    if not mark:
        found = await read_epoch(redis)
        if found != joined:
            raise RedisDataLost(expected=joined, found=found)
        return
    status, value = map(_text, await _EPOCH(redis, [EPOCH_KEY], ["check", joined, f"lost:{joined}"]))
    if status != "ok":
        raise RedisDataLost(expected=joined, found=None if status == "missing" else value)
    if is_cluster(redis):
        lost = [found for found in await _copies(redis, "check", joined) if found[0] != "ok"]
        if lost:  # a master lost its data: every worker started later must refuse, too
            await _EPOCH(redis, [EPOCH_KEY], ["accept", f"lost:{joined}"])
            raise RedisDataLost(expected=joined, found=None if lost[0][0] == "missing" else lost[0][1])


async def _copies(redis: Redis, mode: str, epoch: str) -> list[tuple[str, str]]:
    """Run ``epoch.lua`` in ``mode`` on every copy (one batch: one write per master)."""
    args = [mode, epoch, f"lost:{epoch}"] if mode == "check" else [mode, epoch]
    found = []
    for result in await run_batch(redis, [_EPOCH.call([key], args) for key in EPOCH_COPIES]):
        if isinstance(result, BusError):
            raise result
        found.append((_text(result[0]), _text(result[1])))
    return found


async def accept_epoch(redis: Redis) -> str:
    """Start a new epoch whatever the key held (the operator's ``saga epoch accept``)."""
    _, value = await _EPOCH(redis, [EPOCH_KEY], ["accept", uuid7()])
    if is_cluster(redis):
        await _copies(redis, "accept", _text(value))
    return _text(value)


async def read_epoch(redis: Redis) -> str | None:
    """The current value of ``rs:epoch`` (an id, ``lost:<id>``, or ``None``)."""
    with redis_errors():
        value = await redis.get(EPOCH_KEY)
    return None if value is None else _text(value)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
