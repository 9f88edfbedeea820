"""Print the runtime requirements that users install, for a resolution at their lowest versions.

CI compiles these with ``uv pip compile --resolution lowest-direct`` into constraints and
installs the project with them beside the usual newest resolution, so the suite runs on both
ends of every declared range: a lower bound that no longer works shows up in CI, not on a
user's machine. Runtime dependencies only (``[project].dependencies`` and the optional extras
users install); the dev tools stay at their newest.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

RUNTIME_EXTRAS = ("sqlalchemy", "ui", "tracing")
"""The optional extras that users install (``dev`` and ``peers`` are for this repository)."""


def runtime_requirements(pyproject: Path) -> list[str]:
    """Every runtime requirement, each of which must have a ``>=`` lower bound."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in RUNTIME_EXTRAS:
        requirements += project["optional-dependencies"].get(extra, [])
    for requirement in requirements:
        if not re.search(r">=\s*[0-9]", requirement):
            raise SystemExit(f"{requirement!r} has no lower bound: every runtime dependency needs one")
    return requirements


if __name__ == "__main__":
    print("\n".join(runtime_requirements(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"))))
