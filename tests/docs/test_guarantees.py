"""docs/guarantees.md names the tests that prove each promise: every one must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "guarantees.md").read_text()
TESTS = {path: path.read_text() for path in (ROOT / "tests").rglob("test_*.py")}


def test_every_named_test_exists() -> None:
    missing = []
    for path, name in re.findall(r"(tests/[\w/]+\.py)::(test_\w+)", DOC):
        if f"def {name}(" not in (ROOT / path).read_text():
            missing.append(f"{path}::{name}")
    elided = re.findall(r"`…(test_\w+)", DOC)  # the file was named just before
    missing += [n for n in elided if not any(f"def {n}(" in text for text in TESTS.values())]
    assert missing == []


def test_every_named_test_file_exists() -> None:
    assert [p for p in re.findall(r"`(tests/[\w/]+\.py)", DOC) if not (ROOT / p).exists()] == []


def test_every_catalogue_item_has_a_row() -> None:
    rows = re.findall(r"^\| (\d+) \|", DOC, flags=re.MULTILINE)
    assert [int(n) for n in rows] == list(range(1, 27))
