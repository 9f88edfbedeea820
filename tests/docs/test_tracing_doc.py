"""docs/operations.md's tracing example runs and prints the spans the page shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"


def test_the_tracing_example_prints_the_spans_the_page_shows() -> None:
    section = DOC.read_text().split("## Tracing", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    [shown] = re.findall(r"```text\n(.*?)```", section, flags=re.DOTALL)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert [line.rstrip() for line in done.stdout.splitlines()] == shown.rstrip("\n").splitlines()
