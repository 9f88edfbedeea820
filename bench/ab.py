"""Two revisions of redsaga side by side: the throughput benchmark, rounds alternating.

    python bench/ab.py BEFORE AFTER [--rounds 3] [--redis-url redis://127.0.0.1:6379/14] \
        [-- any bench/saga_throughput.py arguments]

``BEFORE`` and ``AFTER`` are git revisions of this repository (a commit, a branch,
``HEAD~1``), ``.`` for the working tree as it is, or the path of another tree (a
worktree with uncommitted changes). Each revision is checked out with ``git worktree add
--detach`` into a temporary folder, removed at the end. Every round runs
``bench/saga_throughput.py`` from each tree in turn (before, after, before, after, …), with
``PYTHONPATH`` set to that tree and the same arguments (by default ``--sagas 1000 --serial
200 --shapes inflight100,serial --procs 1 --signing on``), so that the machine's drift
between rounds falls on both alike: on shared machines a run's rate moves by up to 2x, its
floor with it, and only the ratio to the floor of the same run compares.

Prints every run's JSON lines as they come, each with ``tree`` (``before``/``after``) and
``round`` added, then one line per tree and benchmark line named ``<name>.median`` with the
median of each number over the rounds, ``ratio_to_floor`` (``rate_per_s`` over the same
run's floor's) among them, and ``rounds``. The benchmark flushes its Redis database: give
it one of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parent
DEFAULT_ARGS = (
    "--sagas", "1000", "--serial", "200", "--shapes", "inflight100,serial", "--procs", "1", "--signing", "on",
)  # fmt: skip
FLOOR = ".floor"


@contextmanager
def checked_out(revision: str) -> Iterator[Path]:
    """A tree of ``revision``, removed when done (``.`` or a folder: that tree, kept)."""
    if revision == "." or Path(revision).is_dir():
        yield REPOSITORY if revision == "." else Path(revision).resolve()
        return
    with tempfile.TemporaryDirectory(prefix="redsaga-ab-") as parent:
        tree = Path(parent) / "tree"
        git = ["git", "-C", str(REPOSITORY), "worktree"]
        add = [*git, "add", "--detach", "--quiet", str(tree), revision]
        added = subprocess.run(add, capture_output=True, text=True, check=False)
        if added.returncode:
            reason = (added.stderr.strip().splitlines() or ["git worktree add failed"])[-1]
            raise SystemExit(f"cannot check out {revision!r}: {reason}")
        try:
            yield tree
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], check=False)


def run_once(tree: Path, url: str, arguments: list[str]) -> list[dict[str, Any]]:
    """One run of the throughput benchmark from ``tree``: its JSON lines."""
    command = [sys.executable, str(tree / "bench" / "saga_throughput.py"), "--redis-url", url, *arguments]
    run = subprocess.run(
        command,
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode:
        raise SystemExit(f"the benchmark failed in {tree}:\n{run.stderr[-2000:]}")
    return [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]


def with_ratios(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``lines`` of one run, each but the floors' with ``ratio_to_floor`` to its own floor.

    A line ``saga.<shape>.<procs>[.<variant>]`` is compared with ``saga.<shape>.<procs>.floor``.
    """
    floors = {line["name"][: -len(FLOOR)]: line for line in lines if line["name"].endswith(FLOOR)}
    out = []
    for line in lines:
        base = ".".join(line["name"].split(".")[:3])
        floor = floors.get(base)
        if floor is not None and not line["name"].endswith(FLOOR) and floor.get("rate_per_s"):
            out.append({**line, "ratio_to_floor": round(line["rate_per_s"] / floor["rate_per_s"], 3)})
        else:
            out.append(line)
    return out


def medians(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tree and line name, the median of every number over the rounds (as ``<name>.median``)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for line in lines:
        groups.setdefault((line["tree"], line["name"]), []).append(line)
    summary = []
    for (tree, name), runs in groups.items():
        keys = [key for key in runs[0] if key != "round" and all(_is_number(run.get(key)) for run in runs)]
        numbers = {key: round(statistics.median(run[key] for run in runs), 3) for key in keys}
        summary.append({"name": f"{name}.median", "tree": tree, "rounds": len(runs), **numbers})
    return summary


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", help="a git revision, . for the working tree, or a tree's folder")
    parser.add_argument("after", help="a git revision, . for the working tree, or a tree's folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDSAGA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    )
    given = sys.argv[1:]
    split = given.index("--") if "--" in given else len(given)  # after it: the benchmark's own
    args = parser.parse_args(given[:split])
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    arguments = given[split + 1 :] or list(DEFAULT_ARGS)
    everything: list[dict[str, Any]] = []
    with ExitStack() as stack:
        trees = {
            name: stack.enter_context(checked_out(rev))
            for name, rev in (("before", args.before), ("after", args.after))
        }
        for round_number in range(1, args.rounds + 1):
            for name, tree in trees.items():
                for line in with_ratios(run_once(tree, args.redis_url, arguments)):
                    tagged = {**line, "tree": name, "round": round_number}
                    everything.append(tagged)
                    print(json.dumps(tagged), flush=True)
    for line in medians(everything):
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
