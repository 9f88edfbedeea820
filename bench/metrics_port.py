"""What the metrics port costs per scrape, beside a bare socket answering the same bytes.

    python bench/metrics_port.py [--scrapes 2000] [--body 30000]

Prints one JSON object per line. ``metrics_port.floor`` is a TCP listener on the same anyio
loop that reads one request and writes a fixed answer of the same size without parsing
anything: the socket work every scrape costs anyway. ``metrics_port.scrape`` is
:class:`bus.metrics.MetricsServer` answering ``GET /metrics`` with a ``--body``-byte
exposition (a worker's scrape is 20-40 KB). Each scrape is a new connection, as Prometheus
makes, sent one at a time by a client in the same process, so ``cpu_us_per_unit`` (process
CPU per scrape) holds both sides; compare ratios to the floor, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from bus.metrics import MetricsServer

REQUEST = (
    b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: Prometheus/3.5.0\r\nAccept: text/plain\r\n\r\n"
)


async def _scrape(port: int) -> int:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(REQUEST)
        size = 0
        try:
            while True:
                size += len(await stream.receive(65536))
        except anyio.EndOfStream:
            return size


async def _floor_server(body: bytes, task_status: anyio.abc.TaskStatus[int]) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)

    async def handle(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive(4096)
            await stream.send(answer)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    async with listener:
        task_status.started(int(listener.extra(anyio.abc.SocketAttribute.local_port)))
        await listener.serve(handle)


async def _measure(
    name: str, start: Callable[[anyio.abc.TaskGroup], Awaitable[int]], scrapes: int
) -> dict[str, object]:
    async with anyio.create_task_group() as tg:
        port = await start(tg)
        for _ in range(50):  # warm up
            await _scrape(port)
        latencies = []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(scrapes):
            began = time.perf_counter()
            await _scrape(port)
            latencies.append((time.perf_counter() - began) * 1000)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        tg.cancel_scope.cancel()
    latencies.sort()
    return {
        "name": name,
        "rate_per_s": round(scrapes / wall, 1),
        "p50_ms": round(statistics.median(latencies), 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)], 3),
        "cpu_us_per_unit": round(cpu / scrapes * 1e6, 1),
    }


async def main(scrapes: int, body_size: int) -> None:
    body = (b'redsaga_x_total{stream="orders/inbox",partition="0"} 1.0\n' * (body_size // 56 + 1))[:body_size]

    async def metrics() -> bytes:
        return body

    async def ready() -> list[str]:
        return []

    async def floor(tg: anyio.abc.TaskGroup) -> int:
        return int(await tg.start(_floor_server, body))

    async def server(tg: anyio.abc.TaskGroup) -> int:
        return int(await tg.start(MetricsServer(metrics, ready).serve))

    for _ in range(2):  # interleaved rounds: the machine is shared
        floor_line = await _measure("metrics_port.floor", floor, scrapes)
        line = await _measure("metrics_port.scrape", server, scrapes)
        line["floor_cpu_us_per_unit"] = floor_line["cpu_us_per_unit"]
        line["ratio_to_floor"] = round(
            float(floor_line["cpu_us_per_unit"]) / float(line["cpu_us_per_unit"]), 3
        )  # type: ignore[arg-type]
        print(json.dumps(floor_line), flush=True)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--body", type=int, default=30000, help="bytes of exposition text per scrape")
    args = parser.parse_args()
    anyio.run(main, args.scrapes, args.body)
