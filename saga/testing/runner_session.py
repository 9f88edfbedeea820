"""The in-process runner's event loop: handlers and local actions are coroutines.

A run (:meth:`Session.run`) gives them one event loop, closed at the end of the run; from
async code (an async test, whose loop is busy) the run goes to a thread of its own. A
runner called from a handler or action it is running is a test's mistake, raised by the
outer call too (inside the handler it would pass for a transient failure).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from saga.errors import RunnerError

T = TypeVar("T")


@dataclass
class Session:
    """One runner's event loop and re-entry guard (see the module's docstring)."""

    busy: bool = False
    misuse: RunnerError | None = None
    loop: asyncio.Runner | None = None

    def run(self, body: Callable[[], None]) -> None:
        """Run ``body`` with an event loop for handlers and actions; from async code, on a thread."""
        if self.busy:
            self.misuse = RunnerError("the runner was called from a handler or action it is running")
            raise self.misuse
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:  # called from async code (an async test): its loop is busy, so use our own thread
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="saga-runner") as pool:
                pool.submit(self.run, body).result()
            return
        self.busy = True
        try:
            body()
        finally:
            self.busy = False
            if self.loop is not None:
                self.loop.close()
                self.loop = None

    def wait(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a handler's or action's coroutine on the run's loop."""
        if self.loop is None:
            self.loop = asyncio.Runner()
        return self.loop.run(coroutine)

    def check(self) -> None:
        """Raise a misuse a handler met (and swallowed, as a transient failure) in this run."""
        if self.misuse is not None:
            misuse, self.misuse = self.misuse, None
            raise misuse
