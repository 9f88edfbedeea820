"""Human output: tables fit the terminal and stay plain elsewhere; values read as words, not
Python (``-``, ``yes``, ``no``); the demo explains its columns and draws progress only on a
terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from redsaga.cli._common import emit_table, fit_columns
from redsaga.cli._format import cell
from redsaga.cli.main import app
from tests.ops.live import flush

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
HEADERS = ["id", "definition", "status", "since", "reason"]
ROWS = [
    [
        "ord-0190a1b2-3c4d-7e8f-9a0b-1c2d3e4f5a6b",
        "order_fulfilment@1",
        "dead_lettered",
        "2026-11-30 08:39:45Z",
        "arrange_shipping ran out of attempts: carrier API returned 503 (5 of 5)",
    ],
    ["ord-2", "order_fulfilment@1", "completed", "2026-11-30 08:40:01Z", None],
]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def printed(monkeypatch: pytest.MonkeyPatch, *, terminal: bool, columns: int = 80) -> str:
    out = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setenv("COLUMNS", str(columns))
    emit_table(HEADERS, ROWS, colours={2: lambda s: "red" if s == "dead_lettered" else None})
    return out.getvalue()


def _in_order(value: str, text: str) -> bool:
    """Whether ``value``'s characters appear in ``text`` in order (a wrapped cell's pieces
    sit between other columns' cells)."""
    position = 0
    for char in value.replace(" ", ""):
        position = text.find(char, position) + 1
        if position == 0:
            return False
    return True


@pytest.mark.parametrize("columns", [80, 100, 200])
def test_a_terminal_table_fits_its_width_and_keeps_every_word(
    monkeypatch: pytest.MonkeyPatch, columns: int
) -> None:
    shown = printed(monkeypatch, terminal=True, columns=columns)
    lines = [ANSI.sub("", line).rstrip() for line in shown.splitlines()]
    assert max(len(line) for line in lines) <= columns
    assert lines[0].split() == HEADERS
    text = "".join(lines).replace(" ", "")
    for value in (v for row in ROWS for v in row if v):
        assert _in_order(value, text), value
    for whole in ("2026-11-30 08:39:45Z", "dead_lettered", "order_fulfilment@1"):  # never broken up
        assert whole in "\n".join(lines)
    assert "\x1b[1m" in shown  # bold headers
    assert "\x1b[31m" in shown  # a coloured status


def test_a_terminal_too_narrow_for_the_table_drops_no_column(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [ANSI.sub("", line) for line in printed(monkeypatch, terminal=True, columns=40).splitlines()]
    assert lines[0].split() == HEADERS
    assert "ord-0190a1" in lines[1]  # the id wraps, at its narrowest width
    assert "2026-11-30 08:39:45Z" in lines[1]


def test_the_widest_columns_give_way_first() -> None:
    assert fit_columns([40, 18, 13, 20, 70], 200) == [40, 18, 13, 20, 70]
    fitted = fit_columns([40, 18, 13, 20, 70], 100)
    assert sum(fitted) + 2 * 4 == 100
    assert fitted[1:4] == [18, 13, 20]  # short columns stay whole
    assert sorted([fitted[0], fitted[4]]) == [20, 21]  # the long ones shrink evenly
    assert fit_columns([40, 18, 13, 20, 70], 30) == [10, 18, 13, 20, 10]  # no narrower than that


def test_elsewhere_a_table_is_plain_one_line_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = printed(monkeypatch, terminal=False, columns=40)
    assert "\x1b" not in shown
    header, first, second = shown.splitlines()
    assert header.split() == HEADERS
    assert first.startswith(ROWS[0][0] + "  order_fulfilment@1  dead_lettered  2026-11-30 08:39:45Z  arrange")
    assert second.split()[-1] == "-"  # None reads as a dash
    assert all(line == line.rstrip() for line in shown.splitlines())
    widths = {line.index("order_fulfilment") for line in shown.splitlines()[1:]}
    assert len(widths) == 1  # columns line up


def test_values_read_as_words_not_python() -> None:
    assert [cell(None), cell(True), cell(False), cell(0), cell("x")] == ["-", "yes", "no", "0", "x"]


def test_the_demo_explains_its_columns_and_prints_no_python_values() -> None:
    result = CliRunner().invoke(app, ["demo", "--orders", "20", "--seed", "3"], env={"REDSAGA_REDIS_URL": ""})
    assert result.exit_code == 0, result.output
    for column in ("outcome", "sagas", "retries", "p50 ms"):
        assert any(line.startswith(f"{column} ") for line in result.stdout.splitlines()), column
    assert "ledger balanced: yes" in result.stdout
    assert "stock released: yes" in result.stdout
    assert not re.search(r"\b(True|False|None)\b", result.output)
    assert result.stderr == ""  # no progress line when stderr is not a terminal


def test_the_demo_draws_its_progress_line_on_a_terminal() -> None:
    controller, terminal = pty.openpty()
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "redsaga.cli", "demo", "--orders", "10"],
            cwd=REPO,
            env={**os.environ, "REDSAGA_REDIS_URL": ""},
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(terminal)
        reader.join(10)
        os.close(controller)
    assert done.returncode == 0
    assert b"\r" in seen
    assert b"completed" in seen  # the counts per status
    assert "\r" not in done.stdout  # the report on stdout is plain


def test_a_dead_letter_missing_its_counts_shows_dashes(capsys: pytest.CaptureFixture[str]) -> None:
    from bus import DeadLetter
    from redsaga.cli import _show

    _show.letter(DeadLetter(dlq="rs:{orders:0}:dlq", id="1-0"))
    shown = capsys.readouterr().out
    assert "(consumer , - deliveries)" in shown
    assert not re.search(r"\b(True|False|None)\b", shown)


@pytest.mark.redis
def test_empty_tables_look_alike_in_every_command(real_redis_url: str) -> None:
    """Headers, then ``(none)``: dead letters and schedules here, tasks in test_tasks_cli.py."""
    flush(real_redis_url)
    env = {"REDSAGA_REDIS_URL": real_redis_url, "REDSAGA_APP": "", "REDSAGA_KEYRING": ""}
    commands = [
        ["dlq", "list", "--tag", "orders:0"],
        ["schedule", "list", "--context", "orders"],
    ]
    for command in commands:
        result = CliRunner().invoke(app, command, env=env)
        assert result.exit_code == 0, (command, result.output)
        header, empty = result.stdout.splitlines()
        assert header.split()[0] in {"letter", "id"}, (command, header)
        assert empty == "(none)", command
