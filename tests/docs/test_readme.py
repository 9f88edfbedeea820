"""The README is tested: its example is the example file, and it runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)


def test_readme_example_is_the_example_file() -> None:
    example = (ROOT / "examples" / "checkout.py").read_text()
    body = example.split('"""', 2)[2].lstrip("\n")  # the file minus its docstring
    assert readme_python_blocks() == [body]


def test_readme_example_runs_and_prints_what_it_says() -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "checkout.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "", "REDSAGA_REDIS_URL": ""},
    )
    assert completed.stdout.splitlines() == ["o1 completed", "o2 compensated"]


def test_readme_quick_start_has_exactly_two_commands() -> None:
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert [c.strip() for c in commands] == [
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/saga demo",
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]' && .venv/bin/python -m pytest",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1].strip() in ci
