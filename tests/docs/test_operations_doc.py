"""docs/operations.md is a test: every ``$ saga ...`` command on the page runs, in order,
against the scenario's sagas, and prints what the page shows (times, durations and ids aside).
The commands run without ``REDSAGA_APP``, as the page says they can: only those that show
``--app`` get the code.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

from redsaga.cli.main import app as cli
from tests.ops.live import Live, live_system
from tests.ops.scenario import FIXED

pytestmark = pytest.mark.redis
DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
runner = CliRunner()
_MASKS = [
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"), "<time>"),
    (re.compile(r"\b\d{13}-\d+\b"), "<entry>"),
    (re.compile(r"\b\d{13}\b"), "<ms>"),  # a time in ms, as the incarnation header
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b\d+[dhm] \d+[hms]\b|\b\d+(?:\.\d+)?m?s\b"), "<duration>"),
]


def examples() -> Iterator[tuple[str, list[str]]]:
    """(command, output lines) for every console block that runs ``saga``."""
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(), flags=re.DOTALL):
        lines = block.rstrip("\n").splitlines()
        if lines[0].startswith("$ saga "):
            yield lines[0][2:], lines[1:]


def masked(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        text = line
        for pattern, token in _MASKS:
            text = pattern.sub(token, text)
        out.append(" ".join(text.split()))
    return [text for text in out if text]


@pytest.fixture
def live(real_redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Live]:
    monkeypatch.chdir(tmp_path)  # saga export --output writes here
    with live_system(real_redis_url) as system:
        yield system


def test_the_operations_page_shows_what_the_commands_print(live: Live) -> None:
    ran = 0
    for command, shown in examples():
        args = shlex.split(command)[1:]
        if args[:1] == ["retry"]:
            FIXED.add(args[1])  # "once the carrier API works again"
        env = {**live.env, "REDSAGA_APP": ""}
        if args[:2] == ["dlq", "show"]:
            letters = msgspec.json.decode(runner.invoke(cli, ["dlq", "list", "--json"], env=env).stdout)
            args[2] = letters[1]["id"]
        result = runner.invoke(cli, args, env=env)
        assert masked(result.output.splitlines()) == masked(shown), f"$ {command}\n{result.output}"
        ran += 1
    assert ran >= 15
