"""Every name the README and docs/ import from ``saga`` (and ``saga.errors``) is there."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
IMPORT = re.compile(r"^from (saga(?:\.errors|\.integrations\.\w+)?) import (\([^)]*\)|[^\n]+)", re.MULTILINE)


def imported_names() -> set[tuple[str, str]]:
    found = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for module, names in IMPORT.findall(page.read_text()):
            for part in names.strip("()").replace("\n", " ").split(","):
                name = part.split("#")[0].split(" as ")[0].strip()
                if name:
                    found.add((module, name))
    return found


def test_every_name_the_docs_import_from_saga_exists() -> None:
    names = imported_names()
    assert ("saga", "role_table") in names
    assert ("saga", "SyncSagaClient") in names
    missing = [f"from {m} import {n}" for m, n in sorted(names) if not hasattr(importlib.import_module(m), n)]
    assert missing == []
