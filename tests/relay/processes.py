"""The relay as a real process (``saga relay``) for fault tests.

Private servers for these tests come from ``tests/faults/servers.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAGA = str(Path(sys.executable).parent / "saga")


@dataclass
class RelayProcess:
    """``saga relay`` running in a child process."""

    args: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] = field(init=False)
    output: bytes = b""

    def __post_init__(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [SAGA, "relay", "--json", *self.args], env=self.env, stdout=subprocess.PIPE, stderr=log
            )

    def wait(self, timeout: float = 60) -> int:
        """Wait for the exit; keep what it printed; return the exit code (-9 after SIGKILL)."""
        out, _ = self.process.communicate(timeout=timeout)
        self.output += out or b""
        return self.process.returncode

    def counters(self) -> dict[str, Any]:
        """The JSON counters the relay printed when it exited."""
        return dict(json.loads(self.output))

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.wait(10)


def start_relay(
    dsn: str, redis_url: str, log: Path, *extra: str, crash_at: str | None = None, tables: str | None = None
) -> RelayProcess:
    env = {k: v for k, v in os.environ.items() if k != "REDSAGA_CRASH_AT"}
    if crash_at:
        env["REDSAGA_CRASH_AT"] = crash_at
    args = ["--dsn", dsn, "--redis-url", redis_url, *(["--tables", tables] if tables else []), *extra]
    return RelayProcess(args, env, log)


def sigterm(process: RelayProcess) -> None:
    process.signal(signal.SIGTERM)
