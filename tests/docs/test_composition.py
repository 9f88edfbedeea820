"""docs/composition.md: every Python block runs, in order, as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).parents[2] / "docs" / "composition.md"


def test_the_composition_page_runs_as_written() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) >= 6
    namespace: dict[str, Any] = {"__name__": "composition_doc"}
    exec(compile("\n".join(blocks), str(DOC), "exec"), namespace)  # noqa: S102 - the doc is the test
