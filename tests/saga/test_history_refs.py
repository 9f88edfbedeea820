"""Stored history entries are compact MessagePack that points at the saga hash; read with the saga, whole."""

from __future__ import annotations

import types
from typing import Any, Literal, get_args, get_origin

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from saga.core.effects import CancelTimer, Dispatch, Effect, StartTimer
from saga.core.history_entry import HistoryEntry
from saga.core.model import Attempt, Migrated, Recorded, SagaState, Started, StepReplied, StepState
from saga.core.states import SagaStatus, StepStatus
from saga.store.history import FORMAT, encode_entry, event_id, read_history
from saga.testing import decode_history

INPUT = b'{"type":"ChargeCard","amount":1}'
OUTPUT = b'{"type":"CardCharged","id":"c1"}'
DATA = b'{"order":"o1","total":5}'


def saga(step: str = "charge", output: bytes = OUTPUT, data: bytes = DATA) -> SagaState:
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
        data=msgspec.Raw(data),
        steps={step: record},
        branches={"fan#0": record},
    )


def dispatch(step: str = "charge", payload: bytes = INPUT, timeout_ms: int | None = 30_000) -> Dispatch:
    return Dispatch(
        step=step,
        kind="do",
        attempt=1,
        participant="payments",
        command_id="c",
        message_type="ChargeCard",
        payload=msgspec.Raw(payload),
        timeout_ms=timeout_ms,
    )


def timeout(step: str = "charge", saga_id: str = "s1") -> StartTimer:
    return StartTimer(
        timer_id=f"{saga_id}:{step}:do:1:timeout",
        delay_ms=30_000,
        purpose="timeout",
        step=step,
        kind="do",
        attempt=1,
    )


def replied(output: bytes = OUTPUT, step: str = "charge") -> StepReplied:
    return StepReplied(
        id="r1",
        at_ms=2,
        step=step,
        kind="do",
        attempt=1,
        command_id="c",
        ok=True,
        output=msgspec.Raw(output),
        worker="w1",
    )


def started(data: bytes = DATA, at: str = "pay@1") -> Started:
    return Started(id="e1", at_ms=1, data=msgspec.Raw(data), by="client", saga=at, steps=["charge", "ship"])


def entry(event: Recorded, *effects: Effect) -> HistoryEntry:
    return HistoryEntry(event=event, effects=list(effects), status=SagaStatus.RUNNING, revision=2)


def test_an_entry_is_stored_as_messagepack_of_its_format_without_what_the_saga_holds() -> None:
    original = entry(started(), dispatch(), timeout())
    stored = encode_entry(original, saga())
    assert msgspec.msgpack.decode(stored)[0] == FORMAT
    for left_out in (DATA, INPUT, b"pay@1", b"payments", b"ChargeCard", b"s1:charge", b"timeout"):
        assert left_out not in stored
    assert read_history([stored], saga()) == [original]


def test_the_stored_form_is_pinned() -> None:
    """Positions are the contract: moving a model field breaks the entries already stored."""
    original = entry(replied(), CancelTimer(timer_id="s1:charge:do:1:timeout"), dispatch("ship"))
    assert encode_entry(original, saga()).hex() == PINNED


PINNED = (
    "96029d02a27231c0a6636861726765a2646f01c0c3c0c0c0c2a27731929203c09901a473686970a2646f01a87061796d656e7473a163"
    "aa43686172676543617264c4207b2274797065223a2243686172676543617264222c22616d6f756e74223a317dcd7530a772756e6e"
    "696e6702a0"
)


def test_payloads_and_outputs_the_records_hold_are_stored_once_and_read_back_whole() -> None:
    original = entry(replied(), dispatch(), dispatch("fan#0"))
    stored = encode_entry(original, saga())
    assert INPUT not in stored
    assert OUTPUT not in stored
    assert read_history([stored], saga()) == [original]


def test_a_replys_time_and_worker_are_its_attempts_and_the_starts_time_the_sagas() -> None:
    state = saga()
    state.created_ms = 1
    state.steps["charge"].attempts[0].worker = "w1"
    for original in (entry(started()), entry(replied())):
        stored = encode_entry(original, state)
        assert b"w1" not in stored
        assert msgspec.msgpack.decode(stored)[1][2] is None  # the time
        assert read_history([stored], state) == [original]
    elsewhere = msgspec.structs.replace(replied(), at_ms=7, worker="w2")
    assert read_history([encode_entry(entry(elsewhere), state)], state) == [entry(elsewhere)]


def test_values_the_records_do_not_hold_are_stored_in_full() -> None:
    original = entry(
        msgspec.structs.replace(replied(b'{"late":true}'), command_id="other", at_ms=9, worker="w9"),
        dispatch(payload=b'{"other":1}'),
        dispatch("unknown"),
        StartTimer(timer_id="elsewhere", delay_ms=5, purpose="retry", step="charge", kind="do", attempt=1),
        CancelTimer(timer_id="s1:charge:do:2:timeout"),
    )
    stored = encode_entry(original, saga())
    for kept in (
        b'{"late":true}',
        b'{"other":1}',
        b"unknown",
        b"elsewhere",
        b"s1:charge:do:2:timeout",
        b"w9",
    ):
        assert kept in stored
    assert read_history([stored], saga()) == [original]


def test_a_timer_is_stored_without_the_id_the_decider_derives() -> None:
    retry = StartTimer(
        timer_id="s1:charge:do:1:retry", delay_ms=5, purpose="retry", step="charge", kind="do", attempt=1
    )
    original = entry(replied(), CancelTimer(timer_id="s1:charge:do:1:timeout"), retry)
    stored = encode_entry(original, saga())
    assert b"s1:" not in stored
    assert read_history([stored], saga()) == [original]


def test_a_timeout_that_is_not_its_commands_own_is_stored_as_a_timer() -> None:
    longer = msgspec.structs.replace(timeout(), delay_ms=60_000)
    for original in (
        entry(started(), dispatch(), longer),
        entry(started(), dispatch(timeout_ms=None), timeout()),
    ):
        assert read_history([encode_entry(original, saga())], saga()) == [original]


def test_the_start_keeps_its_data_and_version_through_a_migration_that_changed_them() -> None:
    before = saga()
    moved = saga("pay", data=b'{"order":"o1","total":6}')
    moved.version = 2
    migrated = HistoryEntry(
        event=Migrated(
            id="m",
            at_ms=3,
            from_version=1,
            to_version=2,
            steps={"charge": "pay"},
            data=moved.data,
        ),
        status=SagaStatus.RUNNING,
        revision=3,
    )
    history = [entry(started(), dispatch(), timeout()), entry(replied(), dispatch()), migrated]
    stored = [encode_entry(e, before) for e in history[:2]] + [encode_entry(migrated, moved, before=before)]
    assert read_history(stored, moved) == history
    with pytest.raises(ValueError, match="before"):
        encode_entry(migrated, moved)


def test_a_start_on_data_the_saga_no_longer_has_is_stored_in_full() -> None:
    original = entry(started(b'{"other":1}', at="pay@0"))
    stored = encode_entry(original, saga())
    assert b'{"other":1}' in stored
    assert b"pay@0" in stored
    assert read_history([stored], saga()) == [original]


@pytest.mark.parametrize("value", [b'"@"', b'"@@"', b"null"])
def test_an_output_is_a_reference_only_when_the_record_holds_it(value: bytes) -> None:
    original = entry(replied(value))
    for recorded in (b'"other"', value):
        assert read_history([encode_entry(original, saga(output=recorded))], saga(output=recorded)) == [
            original
        ]


def test_a_reference_nothing_resolves_is_a_corrupt_history() -> None:
    stored = encode_entry(entry(replied(), dispatch()), saga())
    with pytest.raises(msgspec.DecodeError, match="no record of"):
        read_history([stored], saga("elsewhere"))


@pytest.mark.parametrize(
    "stored",
    [
        b"\x96\x01",  # another format
        b"\x93\x01\xc0",  # cut short
        msgspec.msgpack.encode([FORMAT, [99, "x"], [], "running", 1, ""]),  # an unknown event type
        msgspec.msgpack.encode([FORMAT, [1, "e", 1, None, "", None, [], None], [[8]], "running", 1, ""]),
    ],
)
def test_a_corrupt_entry_is_a_decode_error(stored: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        read_history([stored], saga())


def test_an_entry_in_the_json_form_before_is_refused_as_another_format() -> None:
    with pytest.raises(msgspec.DecodeError, match="JSON"):
        read_history([msgspec.json.encode(entry(replied()))], saga())


def test_an_entry_is_found_by_its_event_id_without_its_saga() -> None:
    assert event_id(encode_entry(entry(replied(), dispatch()), saga())) == "r1"


def test_the_testing_kit_reads_stored_entries_only_with_their_saga() -> None:
    original = entry(replied(), dispatch())
    stored = encode_entry(original, saga())
    assert decode_history([stored], state=saga()) == [original]
    assert decode_history([original]) == [original]  # entries already read are whole
    with pytest.raises(ValueError, match="give state="):
        decode_history([stored])


# Every event and effect type, every field drawn: the stored form reads back as the entry.

_JSON = st.sampled_from([b"null", b"1", b'"@"', b'{"a":[1,2]}', b'"x"']).map(msgspec.Raw)


_SIMPLE: dict[Any, st.SearchStrategy[Any]] = {
    msgspec.Raw: _JSON,
    int: st.integers(-(2**63), 2**63 - 1),
    str: st.text(max_size=8),
    bool: st.booleans(),
    type(None): st.none(),
    SagaStatus: st.sampled_from(list(SagaStatus)),
}


def _values(kind: Any) -> st.SearchStrategy[Any]:
    """Values of a model field's type, as the model allows them (a Struct's field by field)."""
    args = get_args(kind)
    strategy = _SIMPLE.get(kind)
    if strategy is None:
        strategy = {
            Literal: lambda: st.sampled_from(args),
            types.UnionType: lambda: st.one_of([_values(k) for k in args]),
            list: lambda: st.lists(_values(args[0]), max_size=3),
            dict: lambda: st.dictionaries(st.text(max_size=4), _values(args[1]), max_size=3),
        }.get(get_origin(kind), lambda: _structs(kind))()
    return strategy


def _structs(model: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    fields = {f.name: _values(f.type) for f in msgspec.structs.fields(model)}
    return st.fixed_dictionaries(fields).map(lambda values: model(**values))


def _derived(effect: Any, saga_id: str) -> Any:
    """Half the timers get the id the decider would give them (stored without it)."""
    if isinstance(effect, StartTimer):
        return msgspec.structs.replace(
            effect, timer_id=f"{saga_id}:{effect.step}:{effect.kind}:{effect.attempt}:{effect.purpose}"
        )
    return effect


def _recording(state: SagaState, entry: HistoryEntry) -> SagaState:
    """``state`` with a record of every attempt the entry names, holding its values."""
    for item in [entry.event, *entry.effects]:
        if isinstance(item, Dispatch | StepReplied):
            output = item.output if isinstance(item, StepReplied) else msgspec.Raw(b"null")
            attempt = Attempt(
                n=item.attempt,
                kind=item.kind,
                command_id=item.command_id,
                participant=getattr(item, "participant", "p"),
                input_type=getattr(item, "message_type", "T"),
                input=getattr(item, "payload", msgspec.Raw(b"{}")),
                dispatched_ms=1,
                output=output,
            )
            record = state.branches if "#" in item.step else state.steps
            record.setdefault(item.step, StepState()).attempts.append(attempt)
    return state


EVENTS = get_args(Recorded)
EFFECTS = get_args(Effect)


@st.composite
def _entries(draw: st.DrawFn) -> tuple[HistoryEntry, SagaState]:
    """An entry of any event and effects, and a saga that holds some of what it names."""
    state = saga()
    effects = draw(st.lists(st.one_of([_structs(kind) for kind in get_args(Effect)]), max_size=4))
    if draw(st.booleans()):
        effects = [_derived(e, state.id) for e in effects]
    original = HistoryEntry(
        event=draw(st.one_of([_structs(kind) for kind in get_args(Recorded)])),
        effects=effects,
        status=draw(st.sampled_from(list(SagaStatus))),
        revision=draw(st.integers(0, 2**63 - 1)),
        ignored=draw(st.text(max_size=4)),
    )
    if draw(st.booleans()):
        state = _recording(state, original)
    if isinstance(original.event, Started) and draw(st.booleans()):
        state.data = original.event.data
    return original, state


@given(_entries())
def test_every_event_and_effect_reads_back_as_it_was(drawn: tuple[HistoryEntry, SagaState]) -> None:
    original, state = drawn
    stored = encode_entry(original, state, before=saga())
    assert msgspec.msgpack.decode(stored)[0] == FORMAT
    assert read_history([stored], state) == [original]
