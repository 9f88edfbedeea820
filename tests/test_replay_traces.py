"""The regression test to keep in CI: replay exported traces against today's code.

The traces in ``tests/traces/`` were exported from the demo saga (``saga export``; see
``tests/traces/record.py``): plain runs, retries, compensations, and operator actions. If a
change to the definition, the decider or a step's builder would decide one of those runs
differently, replay fails and names the step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from saga import TraceMismatch, decode_trace, replay_trace
from services_example.orders import app
from tests.ops import changed

TRACES = sorted((Path(__file__).parent / "traces").glob("*.json"))


def test_there_are_traces_of_every_outcome() -> None:
    outcomes = {decode_trace(path).state.status for path in TRACES}
    assert outcomes == {"completed", "compensated", "failed", "cancelled"}


@pytest.mark.parametrize("path", TRACES, ids=lambda path: path.stem)
def test_recorded_traces_replay_against_todays_code(path: Path) -> None:
    state = replay_trace(path, app)
    assert state.status == decode_trace(path).state.status


def test_a_changed_command_fails_the_replay_naming_the_step() -> None:
    with pytest.raises(TraceMismatch) as failure:
        replay_trace(Path(__file__).parent / "traces" / "demo-completed.json", changed.charging_a_cent_more())
    mismatch = failure.value.mismatch
    assert mismatch is not None
    assert (mismatch.step, mismatch.what) == ("charge_payment", "effects")
    assert "at step 'charge_payment'" in str(failure.value)


def test_an_inserted_step_fails_the_replay_naming_it() -> None:
    with pytest.raises(TraceMismatch) as failure:
        replay_trace(
            Path(__file__).parent / "traces" / "demo-card-declined.json", changed.with_a_fraud_check()
        )
    assert failure.value.mismatch is not None
    assert failure.value.mismatch.step == "check_fraud"
