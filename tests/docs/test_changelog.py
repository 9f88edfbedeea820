"""CHANGELOG.md: every ``from X import A, B`` it shows imports (names that moved say where to)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"


def test_every_import_the_changelog_shows_works() -> None:
    shown = re.findall(r"`from ([\w.]+) import ([\w, ]+)`", CHANGELOG.read_text())
    assert len(shown) >= 4
    missing = [
        f"{module}.{name.strip()}"
        for module, names in shown
        for name in names.split(",")
        if not hasattr(importlib.import_module(module), name.strip())
    ]
    assert missing == []
