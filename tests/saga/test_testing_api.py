"""saga.testing's documentation runs (its names are pinned in tests/test_public_api.py)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "testing.md"


def test_the_testing_guide_runs() -> None:
    text = DOC.read_text()
    blocks = list(re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL))
    assert blocks
    for block in blocks:
        padding = "\n" * text.count("\n", 0, block.start(1))  # so tracebacks show the guide's lines
        exec(compile(padding + block.group(1), str(DOC), "exec"), {})  # noqa: S102 - the guide's example
