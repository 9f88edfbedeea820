"""Long-lived handler tasks: a delivery is handed to an idle task instead of a new one.

Spawning an anyio task costs about ten times as much as waking a waiting one (tens of
microseconds against a few on CPython 3.11), and a worker starts one handler per entry, so
the pool is on the hot path. The hand-off is a plain asyncio event per idle task, reused
(an anyio memory stream costs several times more per item, and even an anyio Event looks
up the async backend on every construction). Tasks are started on demand up to ``size`` (the
worker's slot count, which already bounds how many handlers run at once) and live in the
caller's task group, so cancelling that group still cancels every handler. Use the pool as
a context manager inside that group: leaving it closes the pool, and the group then waits
only for the handlers still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from anyio.abc import TaskGroup

Function = Callable[..., Coroutine[Any, Any, None]]


class _Idle:
    """A pool task waiting for its next job."""

    __slots__ = ("args", "function", "wake")

    def __init__(self) -> None:
        self.function: Function | None = None
        self.args: tuple[Any, ...] = ()
        self.wake = asyncio.Event()  # the bus runs on asyncio; cheaper than anyio's, reused


class HandlerPool:
    """Runs ``function(*args)`` jobs concurrently on reused tasks of one task group.

    Every job has a task to itself while it runs: a job goes to a task that is idle at
    hand-off, else to a new task.
    """

    def __init__(self, group: TaskGroup, size: int) -> None:
        self._group = group
        self._size = size
        self._tasks = 0
        self._idle: list[_Idle] = []
        self._closed = False

    def start(self, function: Function, *args: Any) -> None:
        """Run ``function(*args)`` on an idle task, or on a new one."""
        if self._closed:
            raise RuntimeError("the handler pool is closed")
        if self._idle:
            idle = self._idle.pop()
            idle.function, idle.args = function, args
            idle.wake.set()
        elif self._tasks < self._size:
            self._tasks += 1
            self._group.start_soon(self._serve, function, args)
        else:  # more jobs than the pool was sized for: a task of its own, outside the pool
            self._group.start_soon(function, *args)

    async def _serve(self, function: Function, args: tuple[Any, ...]) -> None:
        idle = _Idle()
        try:
            while True:
                await function(*args)
                if self._closed:
                    return
                idle.wake.clear()
                idle.function = None
                self._idle.append(idle)
                await idle.wake.wait()
                if idle.function is None:  # woken by close()
                    return
                function, args = idle.function, idle.args
        finally:
            self._tasks -= 1
            if idle in self._idle:  # cancelled while idle
                self._idle.remove(idle)

    @property
    def closed(self) -> bool:
        """Whether the pool takes no more jobs (:meth:`close` was called)."""
        return self._closed

    def close(self) -> None:
        """Accept no more jobs: idle tasks end now, busy ones when their job is done."""
        self._closed = True
        idle, self._idle = self._idle, []
        for task in idle:
            task.wake.set()

    def __enter__(self) -> HandlerPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
