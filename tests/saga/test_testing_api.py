"""saga.testing's public surface is pinned, and its documentation runs."""

from __future__ import annotations

import re
from pathlib import Path

import saga.testing

DOC = Path(__file__).parents[2] / "docs" / "testing.md"


def test_the_public_names_are_pinned() -> None:
    assert saga.testing.__all__ == [
        "Behaviour",
        "Call",
        "FakeParticipant",
        "PendingTimer",
        "ReplayMismatch",
        "RunnerError",
        "SagaRunner",
        "StepSummary",
        "Summary",
        "TraceMismatch",
        "compensation_order",
        "decode_history",
        "duplicate_reply",
        "fail",
        "fail_transiently",
        "handler",
        "invariant_violations",
        "late_reply",
        "no_reply",
        "redeliver",
        "replay",
        "replay_trace",
        "sequence",
        "succeed",
        "summarize",
    ]
    for name in saga.testing.__all__:
        item = getattr(saga.testing, name)
        assert item.__doc__, f"saga.testing.{name} has no docstring"


def test_the_testing_guide_runs() -> None:
    text = DOC.read_text()
    blocks = list(re.finditer(r"```python\n(.*?)```", text, flags=re.DOTALL))
    assert blocks
    for block in blocks:
        padding = "\n" * text.count("\n", 0, block.start(1))  # so tracebacks show the guide's lines
        exec(compile(padding + block.group(1), str(DOC), "exec"), {})  # noqa: S102 - the guide's example
