"""Regenerate the tables in docs/concepts.md from the code: ``python docs/generate.py``.

tests/docs/test_concepts.py fails when the page and the code disagree.
"""

from __future__ import annotations

import re
from pathlib import Path

from saga.ops.graph import lifecycle_table

PAGE = Path(__file__).with_name("concepts.md")
TABLE = re.compile(r"\| from \| to \| when \|\n\| --- \| --- \| --- \|\n(?:\|.*\|\n)*")


def main() -> None:
    """Rewrite the saga table, then the step table, in the order the page shows them."""
    tables = iter([lifecycle_table("saga") + "\n", lifecycle_table("step") + "\n"])
    PAGE.write_text(TABLE.sub(lambda _: next(tables), PAGE.read_text()))


if __name__ == "__main__":
    main()
