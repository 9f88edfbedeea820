"""``saga ui`` as an operator starts it: the URL on stderr, pages served, a clean stop, one-line errors."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from redsaga.cli.main import app
from saga.ops.ui import listen

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.redis
def test_saga_ui_serves_until_sigterm_and_prints_only_its_url(real_redis_url: str) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "redsaga.cli", "ui", "--port", "0", "--redis-url", real_redis_url],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()  # printed once Redis answered and the port is bound
        assert line.startswith("redsaga UI on http://127.0.0.1:"), line
        url = line.split()[3]
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200
        assert "<h1>Sagas</h1>" in page.text
        assert httpx.get(url, headers={"host": "attacker.example"}, timeout=10).status_code == 400
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert stdout == ""
    assert "Traceback" not in stderr


def test_a_port_in_use_is_a_one_line_error() -> None:
    taken = listen("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["ui", "--port", str(port), "--redis-url", "redis://127.0.0.1:1/0"])
    finally:
        taken.close()
    assert result.exit_code == 1
    assert result.stderr == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_without_the_ui_extra_saga_ui_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "saga.ops.ui" or m.startswith("saga.ops.ui.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if it were not installed
    result = runner.invoke(app, ["ui", "--redis-url", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 1
    assert result.stderr == (
        "error: saga ui needs the ui extra (uvicorn is not installed): pip install 'redsaga[ui]'\n"
    )
