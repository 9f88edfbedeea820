"""docs/concepts.md shows the lifecycle tables exactly as the code defines them."""

from __future__ import annotations

from pathlib import Path

from saga.ops.graph import lifecycle_table

DOC = (Path(__file__).parents[2] / "docs" / "concepts.md").read_text()


def test_the_saga_lifecycle_table_is_generated_from_the_code() -> None:
    assert lifecycle_table("saga") in DOC


def test_the_step_lifecycle_table_is_generated_from_the_code() -> None:
    assert lifecycle_table("step") in DOC
