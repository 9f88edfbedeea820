"""The regression test to keep in CI: replay exported traces against today's code.

The traces in ``tests/traces/`` were exported from the demo saga (``saga export``; see
``tests/traces/record.py``): plain runs, retries, compensations, and operator actions. If a
change to the definition, the decider or a step's builder would decide one of those runs
differently, replay fails and names the step.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from redsaga.examples.contracts import Order
from redsaga.examples.orders import app
from saga import Saga, SagaStatus
from saga.ops.trace import TraceMismatch, decode_trace, replay_trace
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
    trace = decode_trace(Path(__file__).parent / "traces" / "demo-completed.json")
    assert (failure.value.saga_id, failure.value.definition) == (
        trace.saga_id,
        f"{trace.definition}@{trace.version}",
    )
    assert isinstance(failure.value, AssertionError)


def test_an_inserted_step_fails_the_replay_naming_it() -> None:
    with pytest.raises(TraceMismatch) as failure:
        replay_trace(
            Path(__file__).parent / "traces" / "demo-card-declined.json", changed.with_a_fraud_check()
        )
    assert failure.value.mismatch is not None
    assert failure.value.mismatch.step == "check_fraud"


DEMO = Path(__file__).parent / "traces" / "demo-completed.json"


def test_a_trace_is_read_from_a_path_of_either_type_or_from_its_json() -> None:
    expected = replay_trace(DEMO, app)
    assert replay_trace(str(DEMO), app) == expected
    assert replay_trace(os.path.relpath(DEMO), app) == expected  # "tests/traces/demo-completed.json"
    assert replay_trace(DEMO.read_bytes(), app) == expected
    assert replay_trace("\n  " + DEMO.read_text(), app) == expected  # JSON text, leading blanks
    assert replay_trace(decode_trace(DEMO), app) == expected


def test_a_str_path_that_does_not_exist_says_so() -> None:
    with pytest.raises(FileNotFoundError, match=r"no-such-trace\.json"):
        replay_trace("tests/traces/no-such-trace.json", app)


def test_a_trace_of_another_format_is_refused() -> None:
    trace = msgspec.structs.replace(decode_trace(DEMO), format="redsaga.trace/0")
    with pytest.raises(ValueError, match=r"unsupported trace format 'redsaga\.trace/0'"):
        decode_trace(msgspec.json.encode(trace))


def test_a_trace_of_another_saga_is_refused() -> None:
    with pytest.raises(ValueError, match="the trace is of 'order_fulfilment', not 'other'"):
        replay_trace(DEMO, Saga("other", context="orders", data=Order))


def test_a_trace_without_history_fails_the_replay() -> None:
    empty = msgspec.structs.replace(decode_trace(DEMO), history=[])
    with pytest.raises(TraceMismatch, match="the trace has no history"):
        replay_trace(empty, app)


def test_a_final_state_that_differs_fails_the_replay_naming_the_fields() -> None:
    trace = decode_trace(DEMO)
    recorded = msgspec.structs.replace(
        trace.state, status=SagaStatus.FAILED, revision=trace.state.revision + 1
    )
    with pytest.raises(TraceMismatch) as failure:
        replay_trace(msgspec.structs.replace(trace, state=recorded), app)
    assert failure.value.mismatch is None
    assert failure.value.differences == [
        "status: recorded failed, replayed completed",
        f"revision: recorded {recorded.revision}, replayed {trace.state.revision}",
    ]
