"""The saga hash's compact records: what they leave out, and that they read back exactly."""

from __future__ import annotations

from typing import get_args

import msgspec
import pytest
from msgspec.structs import replace

from redsaga.ids import derived_id
from saga.core.model import Attempt, GroupState, Kind, Note, Outcome, SagaState, StepState
from saga.core.states import SagaStatus, StepStatus
from saga.store.codec import FORMAT, decode_meta, decode_state, encode_state, state_write
from saga.store.records import KINDS, OUTCOMES, STEP_STATUSES, decode_step, decode_timer, encode_step


def attempt(n: int, command_id: str, output: bytes = b"null") -> Attempt:
    return Attempt(
        n=n,
        kind="do",
        command_id=command_id,
        participant="payments",
        input_type="ChargeCard",
        input=msgspec.Raw(b'{"amount":1}'),
        dispatched_ms=1_700_000_000_000,
        ended_ms=1_700_000_000_004,
        outcome="ok",
        output=msgspec.Raw(output),
        worker="w1",
    )


def state() -> SagaState:
    derived = derived_id("s1", "charge:do:1")
    step = StepState(
        status=StepStatus.SUCCEEDED,
        attempts=[attempt(1, derived, b'{"id":"c1"}'), attempt(2, "operator-chosen", b'{"id":"c2"}')],
        output=msgspec.Raw(b'{"id":"c2"}'),
    )
    forced = StepState(status=StepStatus.SUCCEEDED, output=msgspec.Raw(b'{"forced":true}'))
    return SagaState(
        id="s1",
        name="pay",
        version=1,
        context="orders",
        partition=3,
        status=SagaStatus.RUNNING,
        data=msgspec.Raw(b'{"x":1}'),
        steps={"charge": step, "ship": forced, "later": StepState()},
        cursor=1,
        completed=["charge"],
        error=Note(at_ms=5, what="failed", step="charge"),
        signals={"wait:1": msgspec.Raw(b'{"ok":true}')},
        created_ms=1,
        updated_ms=2,
    )


def test_a_state_reads_back_exactly_from_its_hash_fields() -> None:
    original = state()
    fields = {name.encode(): value for name, value in encode_state(original).items()}
    loaded = decode_state("s1", fields, context="orders", partition=3).state
    assert msgspec.json.encode(loaded) == msgspec.json.encode(original)


def test_the_records_leave_out_what_the_key_and_the_derivations_say() -> None:
    fields = encode_state(state())
    assert b"orders" not in fields["meta"]  # the context and partition are the key's
    assert decode_meta(fields["meta"]).format == FORMAT
    charge = fields["s:charge"]
    assert derived_id("s1", "charge:do:1").encode() not in fields["i:charge:0"]  # derived: left out
    assert b"operator-chosen" in fields["i:charge:1"]  # not derived: kept
    assert charge.count(b'{"id":"c2"}') == 1  # the step's output is its second attempt's
    assert b'{"forced":true}' in fields["s:ship"]  # an output no attempt has is written out


def test_an_attempts_start_is_written_once_and_a_reply_leaves_it_alone() -> None:
    before = state()
    sent = replace(attempt(1, "c"), ended_ms=None, outcome=None, worker=None)
    before.steps["later"] = StepState(status=StepStatus.DISPATCHED, attempts=[sent])
    dispatched = encode_state(before)
    assert b'{"amount":1}' in dispatched["i:later:0"]
    assert b'{"amount":1}' not in dispatched["s:later"]  # the input is in its own field only
    after = before.working_copy()
    after.steps["later"] = after.steps["later"].copy()  # the working copy shares its records
    after.steps["later"].status = StepStatus.SUCCEEDED
    after.steps["later"].attempts[0] = attempt(1, "c", b'{"done":1}')
    write = state_write(before, dispatched, after, changed=True)
    assert set(write.changed) == {"s:later"}  # the reply rewrites the record, not the start
    fields = {name.encode(): value for name, value in write.fields.items()}
    assert decode_state("s1", fields, context="orders", partition=3).state.steps == after.steps


@pytest.mark.parametrize("purpose", ["timeout", "retry"])
def test_a_timer_the_last_attempt_names_is_left_out(purpose: str) -> None:
    record = StepState(status=StepStatus.DISPATCHED, attempts=[attempt(1, "c"), attempt(2, "c2")])
    record.timer = f"s1:charge:do:2:{purpose}"
    raw = encode_step("s1", "charge", record)
    assert b"s1:charge" not in raw
    assert decode_step("s1", "charge", raw) == record
    assert decode_timer("s1", "charge", raw) == record.timer
    record.timer = "s1:charge:do:1:timeout"  # an earlier attempt's: written out
    assert decode_step("s1", "charge", encode_step("s1", "charge", record)) == record


def test_a_record_whose_start_is_missing_is_corrupt() -> None:
    fields = {name.encode(): value for name, value in encode_state(state()).items() if name != "i:charge:1"}
    with pytest.raises(msgspec.DecodeError, match="i:charge:1"):
        decode_state("s1", fields, context="orders", partition=3)


def test_a_branch_record_derives_its_command_ids_from_its_own_key() -> None:
    key = "fan#7"
    record = StepState(attempts=[attempt(1, derived_id("s1", f"{key}:do:1"))])
    raw = encode_step("s1", key, record)
    assert derived_id("s1", f"{key}:do:1").encode() not in raw
    assert b'{"amount":1}' in raw  # a branch record holds its starts
    assert decode_step("s1", key, raw) == record


def test_a_record_naming_an_attempt_it_does_not_have_is_corrupt() -> None:
    raw = msgspec.msgpack.encode([STEP_STATUSES.index(StepStatus.SUCCEEDED), [], 2, None, 0, None, 0, 0])
    with pytest.raises(msgspec.DecodeError, match="attempt 2 of 0"):
        decode_step("s1", "charge", raw)


def test_a_hash_of_another_format_is_refused() -> None:
    with pytest.raises(msgspec.DecodeError, match="format 1"):
        decode_meta(msgspec.msgpack.encode({"v": 1}))
    with pytest.raises(msgspec.DecodeError):  # the first format's JSON
        decode_meta(b'{"context":"orders","partition":0}')


def test_a_step_record_that_did_not_change_is_taken_from_the_fields_before() -> None:
    before = state()
    fields = encode_state(before)
    after = before.working_copy()
    after.steps["later"] = after.steps["later"].copy()  # the working copy shares its records
    after.steps["later"].status = StepStatus.DISPATCHED
    marked = {**fields, "s:charge": b"kept as it was"}  # what a re-encoding would not give
    again = state_write(before, marked, after, changed=True).fields
    assert again["s:charge"] == b"kept as it was"
    assert again["s:later"] == encode_step("s1", "later", after.steps["later"])


def test_every_status_kind_and_outcome_has_one_code() -> None:
    assert sorted(STEP_STATUSES) == sorted(StepStatus)
    assert sorted(KINDS) == sorted(get_args(Kind))
    assert sorted(OUTCOMES) == sorted(get_args(Outcome))
    for codes in (STEP_STATUSES, KINDS, OUTCOMES):
        assert len(set(codes)) == len(codes)


def test_statuses_are_codes_and_a_null_is_nil() -> None:
    sent = replace(attempt(1, derived_id("s1", "charge:undo:1")), kind="undo", outcome="timeout")
    record = StepState(status=StepStatus.COMPENSATION_RETRYING, attempts=[sent])
    raw = encode_step("s1", "charge", record)
    for name in (b"compensation_retrying", b"undo", b"timeout", b"null"):
        assert name not in raw
    stored = msgspec.msgpack.decode(raw)
    assert stored[0] == STEP_STATUSES.index(StepStatus.COMPENSATION_RETRYING)
    assert (stored[1][0][1], stored[1][0][4]) == (KINDS.index("undo"), OUTCOMES.index("timeout"))
    assert stored[1][0][5] is None  # the attempt's output (its worker follows)
    assert len(stored) == 2  # the step's output, null, and every field after it: left out
    assert decode_step("s1", "charge", raw) == record


@pytest.mark.parametrize("position", [0, 1])
def test_a_code_out_of_range_is_corrupt(position: int) -> None:
    stored = [len(STEP_STATUSES), [[1, 0, ["", "p", "T", b"{}", 1], None, None, None, None, None]]]
    if position:
        stored = [0, [[1, len(KINDS), ["", "p", "T", b"{}", 1], None, None, None, None, None]]]
    with pytest.raises(msgspec.DecodeError):
        decode_step("s1", "charge", msgspec.msgpack.encode([*stored, None, None, 0, None, 0, 0]))


def test_the_fields_at_their_defaults_at_the_end_of_a_record_are_left_out() -> None:
    assert encode_step("s1", "charge", StepState()) == msgspec.msgpack.encode([])
    before = state()
    sent = replace(attempt(1, derived_id("s1", "later:do:1")), ended_ms=None, outcome=None, worker=None)
    before.steps["later"] = StepState(status=StepStatus.DISPATCHED, attempts=[sent])
    fields = encode_state(before)
    dispatched = STEP_STATUSES.index(StepStatus.DISPATCHED)
    assert fields["s:later"] == msgspec.msgpack.encode([dispatched, [[1, KINDS.index("do")]]])
    raw = {name.encode(): value for name, value in fields.items()}
    assert decode_state("s1", raw, context="orders", partition=3).state.steps == before.steps


def test_a_group_is_an_array_without_its_field_names() -> None:
    group = GroupState(total=1000, started=60, running=list(range(10, 60)), succeeded=10, completions=10)
    record = StepState(status=StepStatus.DISPATCHED, group=group)
    raw = encode_step("s1", "fan", record)
    assert b"running" not in raw
    assert msgspec.msgpack.decode(raw)[5] == [1000, 60, list(range(10, 60)), 10, 0, 10]  # the rest: defaults
    assert decode_step("s1", "fan", raw) == record
    assert type(decode_step("s1", "fan", raw).group) is GroupState


def test_the_status_name_and_version_come_first_where_the_transition_looks_for_them() -> None:
    before = state()
    assert list(encode_state(before))[:3] == ["status", "name", "version"]
    after = before.working_copy()
    after.status = SagaStatus.COMPENSATING
    after.steps["later"] = after.steps["later"].copy()  # the working copy shares its records
    after.steps["later"].status = StepStatus.DISPATCHED
    changed = state_write(before, encode_state(before), after, changed=True).changed
    assert next(iter(changed)) == "status"


BEFORE = state()


def _changes() -> list[tuple[str, SagaState]]:
    """Decisions' results from :func:`state`, each as a working copy changes it."""
    made: list[tuple[str, SagaState]] = []

    def change(name: str) -> SagaState:
        after = BEFORE.working_copy()
        made.append((name, after))
        return after

    after = change("a step copied and changed, the status and the time moved")
    after.status = SagaStatus.COMPENSATING
    after.updated_ms = 9
    after.steps["later"] = after.steps["later"].copy()
    after.steps["later"].status = StepStatus.DISPATCHED
    after = change("a step dispatched: a new attempt, its start a field of its own")
    after.steps["later"] = StepState(status=StepStatus.DISPATCHED, attempts=[attempt(1, "c-later")])
    after = change("meta only: an early signal kept")
    after.signals = {**after.signals, "wait:2": msgspec.Raw(b"{}")}
    after = change("equal copies of the data and a step: nothing written")
    after.data = msgspec.Raw(bytes(after.data))
    after.steps["ship"] = after.steps["ship"].copy()
    after = change("another version (a decision never does this): every field encoded")
    after.version = 2
    after = change("a trace: written as well")
    after.trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    return made


@pytest.mark.parametrize(
    ("what", "after"), _changes(), ids=lambda value: value if isinstance(value, str) else ""
)
def test_a_decisions_write_is_what_encoding_and_comparing_every_field_gives(
    what: str, after: SagaState
) -> None:
    fields = encode_state(BEFORE)
    every = encode_state(after)
    write = state_write(BEFORE, fields, after, changed=True)
    assert write.fields == every, what
    assert write.changed == {name: value for name, value in every.items() if fields.get(name) != value}, what
    assert write.revision == BEFORE.revision + (1 if write.changed else 0)
    if write.changed.get("status"):
        assert next(iter(write.changed)) == "status"
