"""``bench/budget.py``: the instruction budget CI checks, counted by ``bench/instructions.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import budget
import instructions


def argv(path: Path, *options: str) -> list[str]:
    """The script's command line, counting against a Redis the faked count never reaches."""
    return ["budget.py", "--redis-url", "redis://unused:1/0", "--budget", str(path), *options]


BUDGET = {
    "small": 50,
    "large": 150,
    "features": ["signing"],
    "shapes": {"burst": {"counted": 1000, "budget": 1030}, "serial": {"counted": 2000, "budget": 2060}},
}


def run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, counts: dict[str, float | list[float]], *options: str
) -> tuple[int, Path, list[tuple[str, str, dict[str, object]]]]:
    """Run the script's main on a copy of :data:`BUDGET` with the counts given per shape (a
    list: the first count, then the recount)."""
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(BUDGET))
    calls: list[tuple[str, str, dict[str, object]]] = []

    def per_saga(kind: str, shape: str, url: str, **how: object) -> float:
        calls.append((kind, shape, how))
        count = counts[shape]
        return count.pop(0) if isinstance(count, list) else count

    monkeypatch.setattr(instructions, "per_saga", per_saga)
    monkeypatch.setattr(sys, "argv", argv(path, *options))
    return budget.main(), path, calls


def test_within_budget_prints_each_shape_beside_its_budget(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, calls = run(monkeypatch, tmp_path, {"burst": 1030.2, "serial": 1500})
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        {"name": "saga.burst.signed.instructions", "instructions_per_saga": 1030, "budget": 1030,
         "over": 0.0},
        {"name": "saga.serial.signed.instructions", "instructions_per_saga": 1500, "budget": 2060,
         "over": -0.2718},
    ]  # fmt: skip
    # counted as the file says: redsaga alone, its saga counts and features
    assert calls[0] == ("redsaga", "burst", {"small": 50, "large": 150, "features": ["signing"]})


def test_over_budget_exits_1_with_one_line_naming_the_shape_and_the_overrun(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(monkeypatch, tmp_path, {"burst": 1000, "serial": 2163})
    assert code == 1
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2  # both shapes printed, the one within too
    assert captured.err.count("\n") == 1
    assert (
        "signed serial saga costs 2,163 instructions (counted twice), 103 (5.0%) over its budget of 2,060"
        in captured.err
    )
    assert "burst" not in captured.err


def test_both_shapes_over_are_named_on_the_same_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(monkeypatch, tmp_path, {"burst": 1100, "serial": 2100})
    assert code == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert "burst saga" in error
    assert "serial saga" in error


def test_write_sets_each_budget_to_the_count_plus_three_percent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code, path, _ = run(monkeypatch, tmp_path, {"burst": 900, "serial": 1800}, "--write")
    assert code == 0
    written = json.loads(path.read_text())
    assert written["shapes"] == {
        "burst": {"counted": 900, "budget": 927},
        "serial": {"counted": 1800, "budget": 1854},
    }
    command = "python bench/instructions.py --redsaga-only --signing --small 50 --large 150"
    assert written["command"] == command


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", "cannot read"),
        ("[]", "is not a JSON object"),
        ('{"small": 1, "large": 2, "features": []}', "has no shapes field"),
        ('{"small": 1, "large": 2, "features": [], "shapes": {"burst": {}}}', "shape 'burst' has no integer"),
    ],
)
def test_a_malformed_budget_file_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, error: str
) -> None:
    path = tmp_path / "budget.json"
    path.write_text(text)
    monkeypatch.setattr(sys, "argv", argv(path))
    assert budget.main() == 2
    message = capsys.readouterr().err
    assert error in message
    assert message.count("\n") == 1


def test_a_failed_count_exits_2_with_its_first_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_: object, **__: object) -> float:
        raise RuntimeError("the redsaga run under valgrind failed:\ntraceback …")

    path = tmp_path / "budget.json"
    path.write_text(json.dumps(BUDGET))
    monkeypatch.setattr(instructions, "per_saga", broken)
    monkeypatch.setattr(sys, "argv", argv(path))
    assert budget.main() == 2
    assert capsys.readouterr().err == "budget: the count failed: the redsaga run under valgrind failed:\n"


def test_the_checked_in_budget_is_readable_and_says_how_it_was_measured() -> None:
    data = budget.load(Path(budget.__file__).with_name("budget.json"))
    assert set(data["shapes"]) == {"burst", "serial"}
    assert data["features"] == ["signing"]
    for entry in data["shapes"].values():
        assert entry["budget"] == round(entry["counted"] * (1 + budget.HEADROOM))
    assert f"--small {data['small']} --large {data['large']}" in data["command"]
    assert data["measured"]


def test_a_count_needs_fewer_sagas_in_the_small_run() -> None:
    with pytest.raises(ValueError, match="small < large"):
        instructions.per_saga("redsaga", "burst", "redis://unused:1/0", small=150, large=50)


def test_a_shape_over_its_budget_is_counted_again_and_judged_by_the_lower_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, calls = run(monkeypatch, tmp_path, {"burst": [3600, 1010], "serial": 2000})
    assert code == 0
    assert [shape for _, shape, _ in calls] == ["burst", "serial", "burst"]  # only the shape over
    assert json.loads(capsys.readouterr().out.splitlines()[0])["instructions_per_saga"] == 1010


def test_a_shape_over_its_budget_twice_fails_on_the_lower_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(monkeypatch, tmp_path, {"burst": [1100, 1200], "serial": 2000})
    assert code == 1
    assert "burst saga costs 1,100 instructions (counted twice), 70 (6.8%) over" in capsys.readouterr().err
