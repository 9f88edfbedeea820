"""docs/bus.md's example runs as written, on fakeredis and on real Redis."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import bus

pytestmark = pytest.mark.anyio
DOC = Path(__file__).parents[2] / "docs" / "bus.md"


def _example() -> str:
    match = re.search(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert match, "docs/bus.md lost its example"
    return match.group(1)


async def test_the_example_replies_once_per_command_with_the_first_result(redis: bus.Redis) -> None:
    namespace: dict[str, object] = {"__name__": "bus_example"}
    exec(compile(_example(), str(DOC), "exec"), namespace)  # noqa: S102 - the docs' own code
    await namespace["main"](redis)  # type: ignore[operator]
