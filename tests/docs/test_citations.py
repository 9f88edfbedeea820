"""The repository cites only itself: no reference to documents a user of it does not have.

The fault catalogue and the invariants G1-G8 live in docs/faults.md; code, tests and docs
point there (or to another page of docs/), never to outside design notes, briefs or issue
numbers.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTS = (ROOT / "docs" / "faults.md").read_text()

# Each pattern is a way an outside document was cited; spelled in pieces so that this file
# does not cite them itself.
OUTSIDE = re.compile(
    "|".join(
        [
            r"\b(?:FAULTS|DESIGN|STYLE)\.md\b",
            r"\bFAULTS\s+(?:#?\d|G\d|catalogue)",
            r"\bDESIGN\s*(?:§|section|\")",
            "(?i:design" + r"\s+brief)",
            r"§\s*\d",
            r"\b[Ii]ssue\s*#?\d",
        ]
    )
)


def tracked_text_files() -> list[Path]:
    """Every file git tracks in this checkout that reads as UTF-8 text, but vendored bundles.

    A minified bundle (the web UI's ``mermaid.min.js``) is someone else's code, shipped as it
    is: its identifiers are no citations.
    """
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    files = []
    for name in filter(None, listed.split("\0")):
        path = ROOT / name
        if name.endswith(".min.js"):
            continue
        try:
            path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        files.append(path)
    return files


FILES = tracked_text_files()


def test_the_scan_sees_the_repository() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"docs/faults.md", "saga/definition/retry.py", "tests/faults/checker.py", "compose.yaml"} <= names


@pytest.mark.parametrize(
    "text",
    [
        "see " + "FAULTS" + ".md",
        "(FAULTS 10)",
        "DESIGN §4",
        "design brief §9",
        "the " + "DESIGN" + ".md section",
        "fixed in issue {n}",
        "issue #{n}",
    ],
)
def test_the_pattern_catches_each_way_an_outside_document_was_cited(text: str) -> None:
    # numbers filled in here, so this file's own samples are no citation of a numbered issue
    assert OUTSIDE.search(text.format(n=9))


@pytest.mark.parametrize("text", ["FAULTS_SEED=1", "FAULTS = (", "item 8 of docs/faults.md", "G1-G8"])
def test_the_pattern_leaves_the_repositorys_own_names_alone(text: str) -> None:
    assert not OUTSIDE.search(text)


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in FILES
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == []


def section(title: str) -> str:
    """The text of docs/faults.md's ``## title`` section."""
    start = FAULTS.index(f"\n## {title}\n")
    end = FAULTS.find("\n## ", start + 1)
    return FAULTS[start : end if end > 0 else None]


def test_faults_md_states_every_invariant_in_full() -> None:
    rows = re.findall(r"^\| (G\d) \| \*\*(.+?)\*\* (.+) \|$", section("Invariants"), flags=re.MULTILINE)
    assert [name for name, _, _ in rows] == [f"G{n}" for n in range(1, 9)]
    assert all(len(text) > 40 for _, _, text in rows)  # a statement, not just a name


def test_faults_md_states_every_catalogue_item_with_its_injection_and_assertion() -> None:
    item = re.compile(r"^(\d+)\. \*\*(.+?)\*\*(.+?)(?=^\d+\. |\Z)", re.MULTILINE | re.DOTALL)
    items = item.findall(section("The fault catalogue"))
    assert [int(n) for n, _, _ in items] == list(range(1, 27))
    assert all(len(" ".join(body.split())) > 60 for _, _, body in items)


def test_every_invariant_and_catalogue_item_cited_exists_in_faults_md() -> None:
    invariants = set(re.findall(r"^\| (G\d) \|", section("Invariants"), flags=re.MULTILINE))
    cited: set[str] = set()
    items: set[int] = set()
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        cited |= set(re.findall(r"\bG\d+\b", text))
        items |= {int(n) for n in re.findall(r"catalogue items? (\d+)", text)}
    assert cited - invariants == set()
    assert items - set(range(1, 27)) == set()
