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
benchmark). ``--signing`` runs redsaga with every entry signed and checked, as the throughput
benchmark's ``--signing on`` does (the floor signs nothing). ``--metrics`` installs the
worker's Prometheus metrics (``saga.metrics.WorkerMetrics``) and ``--tracing`` an
OpenTelemetry SDK tracer provider with a span processor, as the throughput benchmark's
``--metrics on`` and ``--tracing on`` do; ``--limits`` declares a rate limit on ``payments``
that every charge finds a token in (the rate gate's own price: one take per saga);
``--keys`` gives the saga a concurrency key on the order id, so every saga takes a free
slot of a line of its own and gives it back (the slot gate's own price); a
``redis+cluster://`` URL runs redsaga through the cluster client (a one-node cluster prices
the routing alone). ``--redsaga-only`` counts redsaga alone, without the floor and the timed
run (what ``bench/budget.py`` and a price per feature need): each line then has
``instructions_per_saga`` and the flags it ran with. Needs ``valgrind`` on the ``PATH``; takes
a few minutes (``--redsaga-only --small 50 --large 150``: about a minute a shape on 2 cores).
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
from collections.abc import Sequence
from pathlib import Path

import anyio

HERE = Path(__file__).resolve().parent
_COLLECTED = re.compile(r"Collected : (\d+)")


#: the child's flags for each feature a count can turn on (redsaga's side only: the floor has none)
FEATURES = ("signing", "metrics", "tracing", "limits", "keys")


def child_command(kind: str, shape: str, sagas: int, url: str, features: Sequence[str] = ()) -> list[str]:
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
        *(f"--{feature}" for feature in features),
    ]


def count(kind: str, shape: str, sagas: int, url: str, features: Sequence[str] = ()) -> int:
    """Instructions valgrind counted for one run of ``sagas`` sagas (start-up included)."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    run = subprocess.run(
        [*command, *child_command(kind, shape, sagas, url, features)],
        capture_output=True,
        text=True,
        check=False,
    )
    found = _COLLECTED.search(run.stderr)
    if run.returncode or found is None:
        raise RuntimeError(f"the {kind} run under valgrind failed:\n{run.stderr[-3000:]}")
    return int(found.group(1))


def per_saga(
    kind: str, shape: str, url: str, *, small: int, large: int, features: Sequence[str] = ()
) -> float:
    """Instructions per saga: the difference between a run of ``large`` and one of ``small``
    sagas over the sagas between them, which leaves out start-up and imports."""
    if not 0 < small < large:
        raise ValueError(f"need 0 < small < large, got small={small} large={large}")
    return (count(kind, shape, large, url, features) - count(kind, shape, small, url, features)) / (
        large - small
    )


def timed(kind: str, shape: str, sagas: int, url: str, features: Sequence[str] = ()) -> dict[str, float]:
    """The same run without valgrind: its rate, latencies and CPU, as the throughput benchmark
    measures them (one run, so as noisy as that benchmark's)."""
    run = subprocess.run(
        child_command(kind, shape, sagas, url, features), capture_output=True, text=True, check=False
    )
    if run.returncode:
        raise RuntimeError(f"the {kind} run failed:\n{run.stderr[-3000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return {key: result[key] for key in ("rate_per_s", "p50_ms", "p99_ms", "cpu_us_per_unit")}


def child(kind: str, shape: str, sagas: int, url: str, features: Sequence[str] = ()) -> None:
    """Run one side once, as the throughput benchmark does; print its result as one JSON line."""
    sys.path.insert(0, str(HERE))
    import saga_throughput  # noqa: PLC0415 - only the child runs it (it patches redis-py)

    from saga.runtime.gc_tuning import tune_gc  # noqa: PLC0415 - importable once saga_throughput set the path

    tune_gc()  # as the throughput benchmark does
    if kind == "floor":
        result = anyio.run(saga_throughput.run_floor, url, shape, sagas, 1, f"{shape}-")
    else:
        run = functools.partial(
            saga_throughput.run_redsaga,
            signed="signing" in features,
            metrics="metrics" in features,
            traced="tracing" in features,
            limited="limits" in features,
            keyed="keys" in features,
        )
        result = anyio.run(run, url, shape, sagas, 1, f"{shape}-")
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
    parser.add_argument("--metrics", action="store_true", help="install the worker's Prometheus metrics")
    parser.add_argument("--tracing", action="store_true", help="install an OpenTelemetry SDK tracer provider")
    parser.add_argument(
        "--limits", action="store_true", help="a rate limit on payments that never holds a command back"
    )
    parser.add_argument(
        "--keys", action="store_true", help="a concurrency key every saga finds free (one line per order)"
    )
    parser.add_argument(
        "--redsaga-only", action="store_true", help="count redsaga alone (no floor, no timed run)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    features = [feature for feature in FEATURES if getattr(args, feature)]
    if args.child:
        child(
            args.child, args.shapes, args.small, args.redis_url, features if args.child == "redsaga" else ()
        )
        return
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt install valgrind)")
    if not 0 < args.small < args.large:
        parser.error("need 0 < --small < --large")
    for shape in args.shapes.split(","):
        name = f"saga.{shape}.1proc.instructions"
        if args.redsaga_only:
            count_ = per_saga(
                "redsaga", shape, args.redis_url, small=args.small, large=args.large, features=features
            )
            print(
                json.dumps({"name": name, "instructions_per_saga": round(count_), "features": features}),
                flush=True,
            )
            continue
        counted, timings = {}, {}
        for kind in ("redsaga", "floor"):
            on = features if kind == "redsaga" else []
            counted[kind] = per_saga(
                kind, shape, args.redis_url, small=args.small, large=args.large, features=on
            )
            timings[kind] = timed(kind, shape, args.large, args.redis_url, on)
        ratio = {"ratio_to_floor": round(counted["floor"] / counted["redsaga"], 3)}
        for kind, line_name, extra in (("redsaga", name, ratio), ("floor", f"{name}.floor", {})):
            line = {"name": line_name, "instructions_per_saga": round(counted[kind]), **extra}
            print(json.dumps({**line, **timings[kind]}), flush=True)


if __name__ == "__main__":
    main()
