"""Worker processes owned by one test: spawn, SIGKILL, SIGSTOP, SIGCONT, read their logs.

A test stops only what it started: :class:`Procs` remembers every process it spawned and,
on close, resumes the stopped ones and kills whatever still runs. Each process writes its
stdout and stderr to its own log file; workers that log JSON lines (structlog) can be waited
on by event name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import structlog

import bus
from saga import SagaWorker
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    """One spawned process and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    stopped: bool = False

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def alive(self) -> bool:
        """Whether the process has not exited."""
        return self.process.poll() is None

    def events(self) -> list[dict[str, Any]]:
        """Every JSON log line written so far (other lines skipped)."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):  # a line being written right now
                    out.append(json.loads(line))
        return out

    def saw(self, event: str) -> bool:
        """Whether the process logged ``event``."""
        return any(e.get("event") == event for e in self.events())

    async def wait_for(self, event: str, timeout: float = 20) -> None:
        """Wait until the process logs ``event`` (fail early if it exits)."""

        def logged() -> bool:
            if not self.alive and not self.saw(event):
                raise AssertionError(
                    f"{self.name} exited ({self.process.returncode}) before logging {event!r}"
                )
            return self.saw(event)

        await eventually(logged, timeout, f"{self.name} logs {event!r}")

    def kill(self) -> None:
        """SIGKILL and reap (a no-op once it has exited)."""
        if self.alive:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.stopped = False

    def terminate(self) -> None:
        """SIGTERM: ask for a graceful stop."""
        self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGSTOP: the process freezes with its sockets open (a GC pause, a stalled VM)."""
        self.process.send_signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        """SIGCONT after :meth:`stop`."""
        self.process.send_signal(signal.SIGCONT)
        self.stopped = False

    async def wait_exit(self, timeout: float = 20) -> int:
        """Wait for the process to end; return its exit code."""
        await eventually(lambda: not self.alive, timeout, f"{self.name} exits")
        return int(self.process.returncode)


@dataclass
class Procs:
    """Spawns ``python -m <module> [args]`` processes with a base environment, and cleans them up."""

    module: str
    logs: Path
    env: Mapping[str, str] = field(default_factory=dict)
    spawned: list[Proc] = field(default_factory=list)

    def spawn(self, name: str, *args: str, **env: str) -> Proc:
        """Start one process named ``name`` with command-line ``args`` and extra ``env``
        (its log is ``<logs>/<name>.log``, appended to)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.logs / f"{name}.log"
        # a crash point is armed only for the process a test names it for
        environment = {k: v for k, v in os.environ.items() if k != "REDSAGA_CRASH_AT"}
        environment.update({**self.env, **env})
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", self.module, *args],
                cwd=ROOT,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(name, process, log_path)
        self.spawned.append(proc)
        return proc

    async def start(self, name: str, *args: str, **env: str) -> Proc:
        """:meth:`spawn`, then wait until the process logs ``ready``."""
        proc = self.spawn(name, *args, **env)
        await proc.wait_for("ready")
        return proc

    @property
    def running(self) -> list[Proc]:
        """The spawned processes that have not exited."""
        return [p for p in self.spawned if p.alive]

    def kill_all(self) -> None:
        """SIGKILL every spawned process still running."""
        for proc in self.spawned:
            if proc.stopped:
                proc.resume()
            proc.kill()

    def tail(self, lines: int = 20) -> str:
        """The last lines of every log, for a failure message."""
        out = []
        for proc in self.spawned:
            text = proc.log_path.read_text(errors="replace").splitlines()[-lines:]
            out.append(
                f"--- {proc.name} (pid {proc.pid}, exit {proc.process.returncode})\n" + "\n".join(text)
            )
        return "\n".join(out)


@contextlib.contextmanager
def owned(procs: Procs) -> Iterator[Procs]:
    """Kill every process ``procs`` spawned when the block ends, however it ends."""
    try:
        yield procs
    finally:
        procs.kill_all()


async def serve_until_killed(worker: SagaWorker, logger: str) -> None:
    """The child's side of :meth:`Procs.start`: serve ``worker``, logging ``ready`` once it consumes."""
    async with anyio.create_task_group() as group:

        async def announce() -> None:
            await worker.started.wait()
            structlog.get_logger(logger).warning("ready", pid=os.getpid())

        group.start_soon(announce)
        await bus.serve(worker)
        group.cancel_scope.cancel()
