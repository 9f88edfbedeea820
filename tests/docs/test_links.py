"""Every relative link in the README and ``docs/`` leads to a file that exists, and to a
heading of it when the link names one (GitHub's anchors: lower case, punctuation dropped,
spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``."""
    text = FENCE.sub("", page.read_text())
    headings = re.findall(r"^#+\s+(.+?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [link for link in LINK.findall(text) if not re.match(r"[a-z]+:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_anchor_rule_matches_githubs() -> None:
    page = ROOT / "docs" / "operations.md"
    assert {"sizing-redis", "worker-processes-and-the-garbage-collector"} <= anchors(page)
