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
"""

from __future__ import annotations

from typing import Final

from bus._client import Redis
from bus._errors import EpochNotSet, RedisDataLost, redis_errors
from bus._scripts import Script
from redsaga.ids import uuid7
from redsaga.streams import PREFIX

EPOCH_KEY: Final = f"{PREFIX}:epoch"
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
    status, value = map(_text, await _EPOCH(redis, [EPOCH_KEY], ["join", uuid7()]))
    if status == "lost":
        raise RedisDataLost(expected=None, found=value)
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


async def accept_epoch(redis: Redis) -> str:
    """Start a new epoch whatever the key held (the operator's ``saga epoch accept``)."""
    _, value = await _EPOCH(redis, [EPOCH_KEY], ["accept", uuid7()])
    return _text(value)


async def read_epoch(redis: Redis) -> str | None:
    """The current value of ``rs:epoch`` (an id, ``lost:<id>``, or ``None``)."""
    with redis_errors():
        value = await redis.get(EPOCH_KEY)
    return None if value is None else _text(value)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
