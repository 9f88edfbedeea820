"""Client instructions per saga (valgrind's count), next to the floor: A/B without the noise.

    python bench/instructions.py [--redis-url redis://127.0.0.1:6379/14] [--shapes burst,serial] [--signing]

The throughput benchmark's timings move by 2x between runs on these shared machines, so a
change worth 3% cannot be seen in them without dozens of alternating runs. This script
counts instead: it runs ``bench/saga_throughput.py``'s redsaga side and its floor (one
process: orchestrator, participants and client) under ``valgrind --tool=callgrind``, at
``--small`` and at ``--large`` sagas, and prints the difference per saga, which leaves out
start-up and imports. The count is of the client's own instructions (Redis is not under
valgrind) and repeats within about 2%. Under valgrind the client runs some fifty times
slower and Redis does not, so batches are as large as the shape allows: the burst shape
counts the work per saga under load, the serial shape one saga at a time. Count one tree
at a time: how the event loop batches its work depends on the machine's load, and so does
the count (four trees counted at once on 2 cores gave up to 25% more than each alone). It is a cost
count, not a speed: instructions differ in price (a Python dict lookup that misses the
cache costs more than a ``sprintf``), so a change is kept on a timed benchmark's word too.

Prints one JSON object per line: ``name`` (``saga.<shape>.1proc.instructions``, the floor's
with ``.floor``), ``instructions_per_saga``, for redsaga ``ratio_to_floor`` (the floor's
count over redsaga's: the share of the floor's rate redsaga would reach if instructions
were all the same price), and ``rate_per_s``, ``p50_ms``, ``p99_ms`` and ``cpu_us_per_unit``
of one run of ``--large`` sagas without valgrind (timed, so as noisy as the throughput
benchmark). ``--signing`` runs redsaga with every entry signed and checked, as the
throughput benchmark's ``--signing on`` does (the floor signs nothing). Needs ``valgrind``
on the ``PATH``; takes a few minutes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
_COLLECTED = re.compile(r"Collected : (\d+)")


def child_command(kind: str, shape: str, sagas: int, url: str, *, signed: bool = False) -> list[str]:
    """The command that runs one side once in a process of its own (see :func:`child`)."""
    return [
        sys.executable,
        __file__,
        "--child",
        kind,
        "--shapes",
        shape,
        "--small",
        str(sagas),
        "--redis-url",
        url,
        *(["--signing"] if signed else []),
    ]


def count(kind: str, shape: str, sagas: int, url: str, *, signed: bool = False) -> int:
    """Instructions valgrind counted for one run of ``sagas`` sagas (start-up included)."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    run = subprocess.run(
        [*command, *child_command(kind, shape, sagas, url, signed=signed)],
        capture_output=True,
        text=True,
        check=False,
    )
    found = _COLLECTED.search(run.stderr)
    if run.returncode or found is None:
        raise RuntimeError(f"the {kind} run under valgrind failed:\n{run.stderr[-3000:]}")
    return int(found.group(1))


def timed(kind: str, shape: str, sagas: int, url: str, *, signed: bool = False) -> dict[str, float]:
    """The same run without valgrind: its rate, latencies and CPU, as the throughput benchmark
    measures them (one run, so as noisy as that benchmark's)."""
    run = subprocess.run(
        child_command(kind, shape, sagas, url, signed=signed), capture_output=True, text=True, check=False
    )
    if run.returncode:
        raise RuntimeError(f"the {kind} run failed:\n{run.stderr[-3000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return {key: result[key] for key in ("rate_per_s", "p50_ms", "p99_ms", "cpu_us_per_unit")}


def child(kind: str, shape: str, sagas: int, url: str, *, signed: bool = False) -> None:
    """Run one side once, as the throughput benchmark does; print its result as one JSON line."""
    sys.path.insert(0, str(HERE))
    import saga_throughput  # noqa: PLC0415 - only the child runs it (it patches redis-py)

    from saga.runtime.gc_tuning import tune_gc  # noqa: PLC0415 - importable once saga_throughput set the path

    tune_gc()  # as the throughput benchmark does
    if kind == "floor":
        result = anyio.run(saga_throughput.run_floor, url, shape, sagas, 1, f"{shape}-")
    else:
        result = anyio.run(
            functools.partial(saga_throughput.run_redsaga, signed=signed), url, shape, sagas, 1, f"{shape}-"
        )
    print(json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDSAGA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")
    )
    parser.add_argument("--shapes", default="burst,serial")
    parser.add_argument("--small", type=int, default=100, help="sagas in the shorter run")
    parser.add_argument("--large", type=int, default=400, help="sagas in the longer run")
    parser.add_argument("--signing", action="store_true", help="sign and check every entry (redsaga's side)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.shapes, args.small, args.redis_url, signed=args.signing)
        return
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt install valgrind)")
    for shape in args.shapes.split(","):
        per_saga, timings = {}, {}
        for kind in ("redsaga", "floor"):
            signed = args.signing and kind == "redsaga"
            small = count(kind, shape, args.small, args.redis_url, signed=signed)
            large = count(kind, shape, args.large, args.redis_url, signed=signed)
            per_saga[kind] = (large - small) / (args.large - args.small)
            timings[kind] = timed(kind, shape, args.large, args.redis_url, signed=signed)
        name = f"saga.{shape}.1proc.instructions"
        ratio = {"ratio_to_floor": round(per_saga["floor"] / per_saga["redsaga"], 3)}
        for kind, line_name, extra in (("redsaga", name, ratio), ("floor", f"{name}.floor", {})):
            line = {"name": line_name, "instructions_per_saga": round(per_saga[kind]), **extra}
            print(json.dumps({**line, **timings[kind]}), flush=True)


if __name__ == "__main__":
    main()
