"""The instruction budget: fail when a signed saga costs more client instructions than allowed.

    python bench/budget.py [--redis-url redis://127.0.0.1:6379/14] [--budget bench/budget.json]

``make budget`` runs it, and so does CI (``.ci/run``). For each shape in ``bench/budget.json``
(``burst``: 100 in flight; ``serial``: one at a time) it counts the client instructions per
signed saga with ``bench/instructions.py`` (valgrind's callgrind, redsaga alone, at the
file's ``small`` and ``large`` saga counts and with its ``features``) and compares the count
with the shape's ``budget``: the count measured when the budget was last set, plus 3%.

Prints one JSON line per shape: ``name``, ``instructions_per_saga``, ``budget`` and
``over`` (how far above the budget, as a fraction; negative when under). Exits 0 when every
shape is within its budget, 1 with a one-line message on stderr naming each shape over it
and by how much (a shape over it is counted a second time and judged by the lower count: on a
loaded machine a count is now and then far above the others), 2 when the budget file or the
count cannot be read. Without ``--redis-url`` it starts a private ``redis-server`` without
persistence (the benchmark flushes its database). The count depends on the machine's load (see
``bench/instructions.py``): count one tree at a time, not beside another benchmark.

A change that lowers the count lowers the budget in the same commit (``--write`` measures
and rewrites the file with today's count plus 3%), so the next slide is caught from there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import instructions  # noqa: E402 - importable once the path above is set

#: how far above the count a budget is set when it is (re)written
HEADROOM = 0.03


class BudgetError(Exception):
    """The budget file is missing or malformed."""


def load(path: Path) -> dict[str, Any]:
    """The budget file, checked for the fields this script reads."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise BudgetError(f"cannot read {path}: {error}") from error
    if not isinstance(data, dict):
        raise BudgetError(f"{path} is not a JSON object")
    missing = [field for field in ("small", "large", "features", "shapes") if field not in data]
    if missing:
        raise BudgetError(f"{path} has no {', '.join(missing)} field")
    for shape, entry in data["shapes"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("budget"), int):
            raise BudgetError(f"{path}: shape {shape!r} has no integer 'budget'")
    return data


def check(counted: int, budget: int) -> float:
    """How far ``counted`` is above ``budget``, as a fraction of the budget (negative: under)."""
    return round(counted / budget - 1, 4)


def overrun_message(shape: str, counted: int, budget: int) -> str:
    """The one line that says which shape went over its budget and by how much."""
    return (
        f"instruction budget exceeded: a signed {shape} saga costs {counted:,} instructions (counted twice), "
        f"{counted - budget:,} ({check(counted, budget):.1%}) over its budget of {budget:,} "
        "(bench/budget.json)"
    )


def measure(data: dict[str, Any], url: str, shapes: list[str] | None = None) -> dict[str, int]:
    """Each shape's count per saga (of ``shapes``, default all), measured as the budget file says."""
    return {
        shape: round(
            instructions.per_saga(
                "redsaga", shape, url, small=data["small"], large=data["large"], features=data["features"]
            )
        )
        for shape in (data["shapes"] if shapes is None else shapes)
    }


def rewrite(path: Path, data: dict[str, Any], counted: dict[str, int]) -> None:
    """Set each shape's budget to today's count plus :data:`HEADROOM`."""
    features = " ".join(f"--{feature}" for feature in data["features"])
    data["measured"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    data["command"] = (
        f"python bench/instructions.py --redsaga-only {features} "
        f"--small {data['small']} --large {data['large']}"
    )
    data["headroom"] = HEADROOM
    data["shapes"] = {
        shape: {"counted": count, "budget": round(count * (1 + HEADROOM))} for shape, count in counted.items()
    }
    path.write_text(json.dumps(data, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--redis-url", help="a Redis to count against (its database is flushed); default: a private one"
    )
    parser.add_argument("--budget", type=Path, default=HERE / "budget.json", help="the budget file")
    parser.add_argument("--write", action="store_true", help="set the budgets to today's count plus 3%%")
    args = parser.parse_args()
    try:
        data = load(args.budget)
    except BudgetError as error:
        print(f"budget: {error}", file=sys.stderr)
        return 2
    with ExitStack() as stack:
        url = args.redis_url
        if not url:
            from tests.conftest import _start_private_redis, pytest_unconfigure  # noqa: PLC0415 - no server given

            url = _start_private_redis()
            stack.callback(pytest_unconfigure, None)
            if not url:
                print("budget: redis-server is not installed; pass --redis-url", file=sys.stderr)
                return 2
        try:
            counted = measure(data, url)
            # a count now and then comes out far above the others on a loaded machine: a shape
            # over its budget is counted once more and judged by the lower of its two counts
            over = [shape for shape, count in counted.items() if count > data["shapes"][shape]["budget"]]
            if over and not args.write:
                for shape, count in measure(data, url, over).items():
                    counted[shape] = min(counted[shape], count)
        except (RuntimeError, OSError) as error:
            print(f"budget: the count failed: {str(error).splitlines()[0]}", file=sys.stderr)
            return 2
    if args.write:
        rewrite(args.budget, data, counted)
        print(f"budget: wrote {shlex.quote(str(args.budget))}", file=sys.stderr)
        data = load(args.budget)
    overruns = []
    for shape, count in counted.items():
        budget = data["shapes"][shape]["budget"]
        line = {"name": f"saga.{shape}.signed.instructions", "instructions_per_saga": count, "budget": budget}
        print(json.dumps({**line, "over": check(count, budget)}), flush=True)
        if count > budget:
            overruns.append(overrun_message(shape, count, budget))
    if overruns:
        print("; ".join(overruns), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
