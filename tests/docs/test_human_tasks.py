"""docs/human-tasks.md: every Python block runs, in order, as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).parents[2] / "docs" / "human-tasks.md"


def test_the_human_tasks_page_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    namespace: dict[str, Any] = {"__name__": "human_tasks_doc"}
    exec(compile("\n".join(blocks), str(DOC), "exec"), namespace)  # noqa: S102 - the doc is the test
    assert "('completed', 'ann')" in capsys.readouterr().out
