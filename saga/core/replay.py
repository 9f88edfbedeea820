"""Replay: run a saga's recorded history through the decider again and compare decisions.

The history (``rs:{ctx:p}:hist:<id>``) keeps every event with its full input and output,
and what was decided for it: the effects, the resulting status and revision, and whether it
was ignored. Replaying it against the current code, without calling any participant, shows
whether today's decider still decides what yesterday's did: the determinism check after a
code change, and the core of ``saga replay`` and of trace replay in CI.

Two decisions are the same when they emit the same effects (commands with their payloads,
timers; compared as JSON values, so a pretty-printed trace compares equal), reach the same
status and revision, and both apply or both ignore the event. An ignored event's reason is
informational: rewording it is not a change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from saga.core.decider import Decision, decide, start
from saga.core.effects import CancelTimer, Dispatch, Effect, StartTimer
from saga.core.history_entry import HistoryEntry
from saga.core.migration import migrate_state
from saga.core.model import Event, Migrated, Recorded, SagaState, Started
from saga.core.rate_rules import hold_recorded
from saga.core.tokens import Signer
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.store.codec import state_write

_json = msgspec.json.Encoder()


class Mismatch(msgspec.Struct, frozen=True, kw_only=True):
    """The first decision that replay made differently from the recorded one.

    Attributes:
        index: Position of the history entry (0 is the start).
        event: The event's kind (``replied``, ``timer``, ``force_completed``, …).
        event_id: The id of the message that carried the event.
        step: The step the differing decision is about (``""`` when none is).
        what: ``effects``, ``status``, ``revision``, ``ignored`` or ``error`` (the current
            code raised while deciding).
        recorded: What the history says was decided.
        replayed: What the current code decides.

    """

    index: int
    event: str
    event_id: str
    step: str
    what: str
    recorded: str
    replayed: str

    @property
    def message(self) -> str:
        """One paragraph naming the entry, the step and both decisions."""
        where = f" at step {self.step!r}" if self.step else ""
        return (
            f"history entry {self.index} ({self.event} {self.event_id}){where}: {self.what} differ(s)\n"
            f"  recorded: {self.recorded}\n  replayed: {self.replayed}"
        )


class ReplayReport(msgspec.Struct, kw_only=True):
    """The outcome of a replay.

    Attributes:
        saga_id: The saga replayed.
        definition: ``name@version`` of the definition the history was replayed against.
        entries: Entries in the history.
        matched: Entries whose decision replay reproduced (all of them when ``ok``).
        mismatch: The first decision that differs, if any.
        state: The state rebuilt from the matching entries.

    """

    saga_id: str
    definition: str
    entries: int
    matched: int
    mismatch: Mismatch | None
    state: SagaState | None

    @property
    def ok(self) -> bool:
        """Whether every recorded decision was reproduced."""
        return self.mismatch is None


def replay_history(
    definitions: Saga[Any] | Registry | Iterable[Saga[Any]],
    history: Sequence[HistoryEntry],
    *,
    saga_id: str,
    partition: int = 0,
    signer: Signer | None = None,
) -> ReplayReport:
    """Replay ``history`` through the decider; report the first decision that differs.

    ``definitions`` is the definition the saga started on, or several versions (a
    :class:`~saga.Registry` or a list): the history names the version it started on, replay
    decides with that one (a v1 history replays on v1 even when v2 is newer) and switches to
    the target version at a recorded migration.
    """
    candidates = [definitions] if isinstance(definitions, Saga) else list(definitions)
    report = ReplayReport(
        saga_id=saga_id, definition="", entries=len(history), matched=0, mismatch=None, state=None
    )
    state: SagaState | None = None
    current: Saga[Any] | None = None
    for index, entry in enumerate(history):
        if (state is None or current is None) and not isinstance(entry.event, Started):
            failure = ("error", "a start", f"the history starts with {type(entry.event).__name__}", "")
            report.mismatch = _mismatch(index, entry, failure, state)
            return report
        # A missing definition is the caller's mistake (ValueError), not a differing decision.
        if state is None or current is None:
            current = _started_on(candidates, entry.event)
            report.definition = current.key
        if isinstance(entry.event, Migrated):
            current, migrating = (
                _version(candidates, current.name, entry.event.to_version, "migrated to"),
                current,
            )
        try:
            if isinstance(entry.event, Migrated):
                decision = _migrate(migrating, current, state, entry.event)
            else:
                decision = _decide(current, state, entry.event, saga_id, partition=partition, signer=signer)
                decision.effects = hold_recorded(decision.state, decision.effects, entry.effects)
        except Exception as error:  # noqa: BLE001 - whatever today's code raises is the finding
            failure = ("error", "a decision", f"{type(error).__name__}: {error}", "")
            report.mismatch = _mismatch(index, entry, failure, state)
            return report
        revision = _revision(state, decision)
        difference = _compare(entry, decision, revision)
        if difference is not None:
            report.mismatch = _mismatch(index, entry, difference, state)
            return report
        if decision.changed or state is None:
            state = decision.state
        state.revision = revision
        report.state = state
        report.matched = index + 1
    return report


def _started_on(candidates: list[Saga[Any]], event: Recorded) -> Saga[Any]:
    if not isinstance(event, Started):
        raise ValueError(f"a history starts with the saga's start, not {type(event).__name__}")  # noqa: TRY004 - bad data, not a bad call
    if event.saga:
        name, _, version = event.saga.rpartition("@")
        return _version(candidates, name, int(version), "the history started on it")
    if len(candidates) != 1:
        raise ValueError("this history does not name the version it started on: give that one definition")
    return candidates[0]


def _version(candidates: list[Saga[Any]], name: str, version: int, why: str) -> Saga[Any]:
    for definition in candidates:
        if (definition.name, definition.version) == (name, version):
            return definition
    given = ", ".join(d.key for d in candidates)
    raise ValueError(f"replay needs {name}@{version} ({why}); given: {given}")


def _migrate(source: Saga[Any], target: Saga[Any], state: SagaState | None, event: Migrated) -> Decision:
    """Apply a recorded migration again (it changes the state directly; no effects)."""
    if state is None:
        raise ValueError("a migration is recorded before the saga started")
    return Decision(migrate_state(source, target, state, event), [], "")


def _decide(
    definition: Saga[Any],
    state: SagaState | None,
    event: Event,
    saga_id: str,
    *,
    partition: int,
    signer: Signer | None,
) -> Decision:
    if state is None:
        if not isinstance(event, Started):
            raise ValueError(f"a history starts with the saga's start, not {type(event).__name__}")
        return start(definition, saga_id, bytes(event.data), partition, event, signer=signer)
    if isinstance(event, Started):
        raise ValueError("a second start in one history")  # noqa: TRY004 - bad data, not a bad call
    return decide(definition, state, event, signer=signer)


def _revision(before: SagaState | None, decision: Decision) -> int:
    """The revision the store gives this decision (the store's own rule, :func:`state_write`)."""
    return state_write(
        before, None, decision.state, changed=decision.changed, touched=decision.touched
    ).revision


def _compare(entry: HistoryEntry, decision: Decision, revision: int) -> tuple[str, str, str, str] | None:
    """``(what, recorded, replayed, step)`` of the first difference, or ``None``."""
    recorded_ignored, replayed_ignored = bool(entry.ignored), bool(decision.ignored)
    if recorded_ignored != replayed_ignored:
        return (
            "ignored",
            f"ignored ({entry.ignored})" if entry.ignored else "applied",
            f"ignored ({decision.ignored})" if decision.ignored else "applied",
            "",
        )
    recorded, replayed = entry.effects, decision.effects
    if not same_json([_json.encode(e) for e in recorded], [_json.encode(e) for e in replayed]):
        first = next(
            i
            for i in range(max(len(recorded), len(replayed)))
            if i >= min(len(recorded), len(replayed))
            or not same_json([_json.encode(recorded[i])], [_json.encode(replayed[i])])
        )
        differing = [effects[first] for effects in (replayed, recorded) if first < len(effects)]
        step = next((str(getattr(e, "step", "")) for e in differing if getattr(e, "step", "")), "")
        return "effects", _describe(recorded), _describe(replayed), step
    if entry.status != decision.state.status:
        return "status", str(entry.status), str(decision.state.status), ""
    if entry.revision != revision:
        return "revision", str(entry.revision), str(revision), ""
    return None


def same_json(left: Sequence[bytes], right: Sequence[bytes]) -> bool:
    """Whether two lists of JSON documents hold the same values (whitespace aside)."""
    if len(left) != len(right):
        return False
    return all(
        a == b or msgspec.json.decode(a) == msgspec.json.decode(b) for a, b in zip(left, right, strict=True)
    )


def _mismatch(
    index: int, entry: HistoryEntry, difference: tuple[str, str, str, str], state: SagaState | None
) -> Mismatch:
    what, recorded, replayed, step = difference
    return Mismatch(
        index=index,
        event=_tag(entry.event),
        event_id=entry.event.id,
        step=step or _step_of(entry, state),
        what=what,
        recorded=recorded,
        replayed=replayed,
    )


def _step_of(entry: HistoryEntry, state: SagaState | None) -> str:
    """The event's step, else the step the saga was at."""
    step = getattr(entry.event, "step", "")
    if isinstance(step, str) and step:
        return step
    if state is not None:
        names = list(state.steps)
        return names[state.cursor] if state.cursor < len(names) else ""
    return ""


def _describe(effects: Sequence[Effect]) -> str:
    """The effects, most telling first: ``dispatch charge_payment/do #1 -> payments ChargeCard {…}``."""
    if not effects:
        return "no effects"
    return "; ".join(_describe_one(e) for e in effects)


def _describe_one(effect: Effect) -> str:
    if isinstance(effect, Dispatch):
        return (
            f"dispatch {effect.step}/{effect.kind} #{effect.attempt} -> {effect.participant} "
            f"{effect.message_type} {bytes(effect.payload).decode(errors='replace')}"
        )
    if isinstance(effect, StartTimer):
        return f"timer {effect.step}/{effect.kind} #{effect.attempt} {effect.purpose} in {effect.delay_ms} ms"
    assert isinstance(effect, CancelTimer)  # noqa: S101 - Effect is a closed union
    return f"cancel timer {effect.timer_id}"


def _tag(event: Recorded) -> str:
    config = type(event).__struct_config__
    return config.tag if isinstance(config.tag, str) else type(event).__name__
