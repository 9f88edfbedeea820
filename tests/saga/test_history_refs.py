"""Stored history entries point at the step records; read with the saga, they are whole again."""

from __future__ import annotations

import msgspec
import pytest

from saga.core.model import (
    Attempt,
    Dispatch,
    HistoryEntry,
    Migrated,
    SagaState,
    StepReplied,
    StepState,
)
from saga.core.replay import decode_entries
from saga.core.states import SagaStatus, StepStatus
from saga.store.history import encode_entry, read_history
from saga.testing import decode_history

INPUT = b'{"type":"ChargeCard","amount":1}'
OUTPUT = b'{"type":"CardCharged","id":"c1"}'


def saga(step: str = "charge", output: bytes = OUTPUT) -> SagaState:
    attempt = Attempt(
        n=1,
        kind="do",
        command_id="c",
        participant="payments",
        input_type="ChargeCard",
        input=msgspec.Raw(INPUT),
        dispatched_ms=1,
        ended_ms=2,
        outcome="ok",
        output=msgspec.Raw(output),
    )
    record = StepState(status=StepStatus.SUCCEEDED, attempts=[attempt], output=msgspec.Raw(output))
    return SagaState(
        id="s1",
        name="pay",
        version=1,
        context="orders",
        partition=0,
        status=SagaStatus.RUNNING,
        data=msgspec.Raw(b"{}"),
        steps={step: record},
        branches={"fan#0": record},
    )


def dispatch(step: str = "charge", payload: bytes = INPUT) -> Dispatch:
    return Dispatch(
        step=step,
        kind="do",
        attempt=1,
        participant="payments",
        command_id="c",
        message_type="ChargeCard",
        payload=msgspec.Raw(payload),
    )


def replied(output: bytes = OUTPUT, step: str = "charge") -> StepReplied:
    return StepReplied(
        id="r1", at_ms=2, step=step, kind="do", attempt=1, command_id="c", ok=True, output=msgspec.Raw(output)
    )


def entry(event: StepReplied, *effects: Dispatch) -> HistoryEntry:
    return HistoryEntry(event=event, effects=list(effects), status=SagaStatus.RUNNING, revision=2)


def test_payloads_and_outputs_the_records_hold_are_stored_once_and_read_back_whole() -> None:
    original = entry(replied(), dispatch(), dispatch("fan#0"))
    stored = encode_entry(original, saga())
    assert INPUT not in stored
    assert OUTPUT not in stored
    assert read_history([stored], saga()) == [original]


def test_values_the_records_do_not_hold_are_stored_in_full() -> None:
    original = entry(replied(b'{"late":true}'), dispatch(payload=b'{"other":1}'), dispatch("unknown"))
    stored = encode_entry(original, saga())
    assert b'{"late":true}' in stored
    assert b'{"other":1}' in stored
    assert read_history([stored], saga()) == [original]


@pytest.mark.parametrize("value", [b'"@"', b'"@@"', b'"@@@"'])
def test_an_output_that_is_a_string_of_at_signs_is_not_taken_for_a_reference(value: bytes) -> None:
    original = entry(replied(value))
    stored = encode_entry(original, saga(output=b'"other"'))
    assert read_history([stored], saga(output=b'"other"')) == [original]
    assert read_history([encode_entry(original, saga(output=value))], saga(output=value)) == [original]


def test_an_entry_before_a_migration_is_resolved_through_the_step_renaming() -> None:
    before = entry(replied(), dispatch())
    migrated = HistoryEntry(
        event=Migrated(
            id="m", at_ms=3, from_version=1, to_version=2, steps={"charge": "pay"}, data=msgspec.Raw(b"{}")
        ),
        status=SagaStatus.RUNNING,
        revision=3,
    )
    stored = [encode_entry(before, saga()), msgspec.json.encode(migrated)]
    assert read_history(stored, saga("pay")) == [before, migrated]


def test_a_reference_nothing_resolves_is_a_corrupt_history() -> None:
    stored = encode_entry(entry(replied(), dispatch()), saga())
    assert decode_entries([stored])[0].effects[0].payload == msgspec.Raw(b'"@"')  # as stored
    with pytest.raises(msgspec.DecodeError, match="no record of"):
        read_history([stored], saga("elsewhere"))


def test_command_ids_the_records_hold_are_stored_once() -> None:
    original = entry(replied(), dispatch())
    stored = encode_entry(original, saga())
    assert msgspec.json.decode(stored)["event"]["command_id"] == "@"
    assert msgspec.json.decode(stored)["effects"][0]["command_id"] == "@"


@pytest.mark.parametrize("command_id", ["@", "@@", "other"])
def test_a_reply_for_another_command_keeps_its_id_whatever_it_is(command_id: str) -> None:
    original = entry(msgspec.structs.replace(replied(), command_id=command_id))
    assert read_history([encode_entry(original, saga())], saga()) == [original]


def test_the_testing_kit_reads_stored_entries_only_with_their_saga() -> None:
    original = entry(replied(), dispatch())
    stored = encode_entry(original, saga())
    assert decode_history([stored], state=saga()) == [original]
    assert decode_history([original]) == [original]  # entries already read are whole
    with pytest.raises(ValueError, match="give state="):
        decode_history([stored])
