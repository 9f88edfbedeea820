"""Long-lived handler tasks: a delivery is handed to an idle task instead of a new one.

Spawning an anyio task costs about ten times as much as handing work to a waiting one
(tens of microseconds against a few on CPython 3.11), and a worker starts one handler per
entry, so the pool is on the hot path. Tasks are started on demand up to ``size`` (the
worker's slot count, which already bounds how many handlers run at once) and live in the
caller's task group, so cancelling that group still cancels every handler. Use it as a
context manager inside that group: leaving it closes the pool, and the group then waits
only for the handlers still running.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import anyio
from anyio.abc import TaskGroup

Job = tuple[Callable[..., Coroutine[Any, Any, None]], tuple[Any, ...]]


class HandlerPool:
    """Runs ``function(*args)`` jobs concurrently on reused tasks of one task group.

    Every job gets a task of its own for as long as it runs: a job is only ever handed to
    a task that is idle (claimed at hand-off), or to a new task when none is.
    """

    def __init__(self, group: TaskGroup, size: int) -> None:
        self._group = group
        self._size = size
        self._tasks = 0
        self._idle = 0
        self._send, self._receive = anyio.create_memory_object_stream[Job](size)

    def start(self, function: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        """Run ``function(*args)`` on an idle task, or on a new one."""
        if self._idle:
            self._idle -= 1
            self._send.send_nowait((function, args))
        elif self._tasks < self._size:
            self._tasks += 1
            self._group.start_soon(self._serve, function, args)
        else:  # more jobs than the pool was sized for: a task of its own, outside the pool
            self._group.start_soon(function, *args)

    async def _serve(self, function: Callable[..., Coroutine[Any, Any, None]], args: tuple[Any, ...]) -> None:
        idle = False
        try:
            while True:
                await function(*args)
                self._idle += 1
                idle = True
                try:
                    function, args = await self._receive.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    return
                idle = False  # start() took this task off the idle count when it handed over
        finally:
            self._tasks -= 1
            if idle:
                self._idle -= 1

    def close(self) -> None:
        """Accept no more jobs: idle tasks end now, busy ones when their job is done."""
        self._idle = 0
        self._send.close()
        self._receive.close()

    def __enter__(self) -> HandlerPool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
