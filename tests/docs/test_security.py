"""docs/security.md is a test: its ACL lines are what ``saga acl`` prints for the demo app,
the size limits it names are the configs' defaults, and the README links it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from bus import BusConfig
from redsaga.cli.main import app as cli

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
runner = CliRunner()


def test_the_acl_lines_on_the_page_are_what_saga_acl_prints() -> None:
    [block] = re.findall(r"```console\n\$ (saga acl .*?)\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    command, shown = block
    result = runner.invoke(cli, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
    assert shown == result.stdout, "regenerate the block: " + command


def test_the_size_limits_on_the_page_are_the_defaults() -> None:
    text = DOC.read_text()
    config = BusConfig()
    shown = {
        "`BusConfig.max_payload_bytes` (1 MiB)": config.max_payload_bytes == 1 << 20,
        "`BusConfig.max_entry_bytes` (1 MiB + 64 KiB)": config.max_entry_bytes == (1 << 20) + (64 << 10),
        "`BusConfig.dlq_field_cap_bytes` (64 KiB)": config.dlq_field_cap_bytes == 64 << 10,
        "`BusConfig.dedupe_quota` (10,000,000)": config.dedupe_quota == 10_000_000,
    }
    assert {line: line in text and right for line, right in shown.items()} == dict.fromkeys(shown, True)


def test_nothing_imports_pickle() -> None:
    sources = [p for package in ("bus", "saga", "relay", "cli") for p in (ROOT / package).rglob("*.py")]
    assert [p for p in sources if re.search(r"^\s*(import|from)\s+c?pickle\b", p.read_text(), re.M)] == []


def test_the_readme_links_the_page() -> None:
    assert "(docs/security.md)" in (ROOT / "README.md").read_text()
