"""docs/relay.md's example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import bus

pytestmark = pytest.mark.anyio
DOC = Path(__file__).parents[2] / "docs" / "relay.md"


def _example() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Example: a participant") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "docs/relay.md lost its example"
    return match.group(1)


async def test_the_participant_example_charges_once_and_replies_to_each_command(tmp_path: Path):
    namespace: dict[str, object] = {"__name__": "relay_example"}
    exec(compile(_example(), str(DOC), "exec"), namespace)  # noqa: S102 - the docs' own code
    redis = bus.connect(bus.MEMORY_URL)
    try:
        await namespace["main"](str(tmp_path / "payments.db"), redis)  # type: ignore[operator]
    finally:
        await redis.aclose()


@pytest.mark.parametrize(("dialect", "title"), [("postgresql", "### PostgreSQL"), ("sqlite", "### SQLite")])
def test_the_documented_ddl_is_what_init_db_applies(dialect: str, title: str):
    import relay

    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(title) :]
    match = re.search(r"```sql\n(.*?)```", section, re.DOTALL)
    assert match
    assert match.group(1) == relay.ddl(dialect), "docs/relay.md's DDL is stale: paste 'saga relay ddl' output"
