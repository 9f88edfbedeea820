"""The worker's health file: a timestamp the worker rewrites after each PING its Redis answers.

A worker given a path (``EngineConfig.health_file``, or ``$REDSAGA_HEALTH_FILE`` for
``saga worker``) writes the time into it once it reads its streams, and again every
``EngineConfig.heartbeat_ms`` after a ``PING`` on its own Redis client succeeded. The
file is renewed from the worker's event loop, so it goes stale when that loop is stuck (a
handler blocking it, a deadlock) and when Redis stops answering; ``saga health worker``
judges its age. It is removed when the worker starts and when it stops.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

import anyio

from bus import BusError, Clock
from bus.lowlevel import get_logger, redis_errors

HEALTH_FILE_ENV: Final = "REDSAGA_HEALTH_FILE"
_log = get_logger("redsaga.saga")


def health_file_from_env() -> str | None:
    """``$REDSAGA_HEALTH_FILE``, or ``None`` when it is unset or empty."""
    return os.environ.get(HEALTH_FILE_ENV) or None


async def keep_health_file(redis: Any, path: str, clock: Clock, period_ms: int, ready: anyio.Event) -> None:
    """Once ``ready`` is set, write ``clock``'s time to ``path`` after every answered PING."""
    target = anyio.Path(path)
    fresh = anyio.Path(f"{path}.new")
    await ready.wait()
    try:
        while True:
            try:
                with redis_errors():
                    await redis.ping()
                await fresh.write_text(str(clock.now_ms()))
                await fresh.replace(target)  # a reader never sees a half-written file
            except (BusError, OSError) as error:
                _log.warning("the health file was not renewed", path=path, error=str(error))
            await clock.sleep(period_ms / 1000)
    finally:
        with anyio.CancelScope(shield=True):
            await remove_health_file(path)


async def remove_health_file(path: str) -> None:
    """Remove ``path`` (a stale file from an earlier run must not vouch for this one)."""
    await anyio.Path(path).unlink(missing_ok=True)


def health_file_age_ms(path: str, now_ms: int) -> int | None:
    """How long ago the worker renewed ``path`` (``None``: there is no such file)."""
    try:
        written = Path(path).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    if not written.isdigit():
        raise ValueError(f"{path} is not a redsaga health file (it holds {written[:40]!r})")
    return now_ms - int(written)
