"""A throwaway ``redis-server`` for a benchmark that needs a server of its own.

    with private_redis() as url: ...

No persistence, a free port, a temporary directory removed afterwards. Benchmarks that take
``--redis-url`` use this when none is given, so they never touch a server they did not start.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def private_redis(prefix: str = "bench-") -> Iterator[str]:
    """Start a private ``redis-server``; yield its URL (database 0); stop and remove it after."""
    directory = tempfile.mkdtemp(prefix=prefix)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", directory],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_until_it_answers(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _wait_until_it_answers(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as connection:
                connection.sendall(b"PING\r\n")
                if connection.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.02)  # polling a server's start-up in a benchmark, not timing engine code
    raise RuntimeError(f"the private redis-server on port {port} did not answer in {timeout_s} s")
