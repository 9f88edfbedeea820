"""``bench/ab.py``: two revisions' throughput, rounds alternating, ratios to each run's floor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REDIS_URL, require_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import ab

BENCH = Path(__file__).resolve().parents[1] / "bench" / "ab.py"


def test_each_line_is_compared_with_the_floor_of_its_own_run() -> None:
    run = [
        {"name": "saga.serial.1proc.signed", "rate_per_s": 300.0},
        {"name": "saga.serial.1proc.floor", "rate_per_s": 600.0},
        {"name": "saga.serial.1proc.celery", "rate_per_s": 150.0},
        {"name": "saga.bench.process", "max_rss_kb": 1},
    ]
    ratios = [line.get("ratio_to_floor") for line in ab.with_ratios(run)]
    assert ratios == [0.5, None, 0.25, None]


def test_the_summary_is_the_median_over_rounds_per_tree_and_line() -> None:
    lines = [
        {"name": "saga.serial.1proc.signed", "tree": tree, "round": n, "rate_per_s": rate, "failed": 0}
        for tree, rates in (("before", (1.0, 5.0, 3.0)), ("after", (2.0, 4.0, 9.0)))
        for n, rate in enumerate(rates, 1)
    ]
    summary = {line["tree"]: line for line in ab.medians(lines)}
    assert summary["before"] == {
        "name": "saga.serial.1proc.signed.median", "tree": "before", "rounds": 3,
        "rate_per_s": 3.0, "failed": 0,
    }  # fmt: skip
    assert summary["after"]["rate_per_s"] == 4.0


def test_a_revision_is_checked_out_apart_and_removed_afterwards() -> None:
    with ab.checked_out("HEAD") as tree:
        assert tree != ab.REPOSITORY
        assert (tree / "bench" / "ab.py").is_file()
    assert not tree.exists()
    with ab.checked_out(".") as here:
        assert here == ab.REPOSITORY


def test_a_revision_that_does_not_exist_is_a_one_line_error() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH), "no-such-revision", ".", "--rounds", "1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 1
    [line] = run.stderr.strip().splitlines()  # git's own words follow, as git says them
    assert line.startswith("cannot check out 'no-such-revision': ")


def test_two_revisions_run_alternately_from_their_own_trees() -> None:
    require_server("Redis", REDIS_URL)
    url = REDIS_URL.rsplit("/", 1)[0] + "/13"  # the benchmark flushes its database
    run = subprocess.run(
        [sys.executable, str(BENCH), "HEAD", ".", "--rounds", "2", "--redis-url", url, "--",
         "--sagas", "10", "--serial", "5", "--shapes", "serial", "--procs", "1"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    order = [(line["round"], line["tree"]) for line in lines if line["name"] == "saga.serial.1proc"]
    assert order == [(1, "before"), (1, "after"), (2, "before"), (2, "after")]
    medians = {(line["tree"], line["name"]): line for line in lines if line["name"].endswith(".median")}
    for tree in ("before", "after"):
        line = medians[tree, "saga.serial.1proc.median"]
        assert line["rounds"] == 2
        assert line["ratio_to_floor"] > 0
        assert line["failed"] == 0
    listed = subprocess.run(["git", "worktree", "list"], capture_output=True, text=True, check=True).stdout
    assert "redsaga-ab-" not in listed  # the checked-out revision is removed
