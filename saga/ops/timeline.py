"""A saga's timeline as ``saga inspect`` and the UI show it: history entries and task actions.

Each history entry becomes one :class:`TimelineRow` (what happened, what was decided, where
it left the saga), and the saga's task log is merged in by time (:func:`merge_task_log`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from saga.core.effects import (
    CancelTimer,
    Dispatch,
    Effect,
    NotifyParent,
    StartTimer,
    UnwatchEvent,
    WatchEvent,
)
from saga.core.history_entry import HistoryEntry
from saga.core.model import (
    CancelRequested,
    ForceCompleted,
    Migrated,
    Recorded,
    RedriveRequested,
    RetryRequested,
    Started,
    StepReplied,
    TimerFired,
)
from saga.core.states import SagaStatus
from saga.core.task_rules import TaskLog
from saga.ops.durations import human_ms


class TimelineRow(msgspec.Struct, kw_only=True):
    """One line of the saga's timeline: a history entry, or an action on one of its human tasks.

    A history entry (``source="history"``, ``index`` its place in the history) says what
    happened, what was decided and where it left the saga. A task action (``source="task"``,
    ``index`` its place in the saga's task log, ``by`` who acted) is merged in by time;
    ``status`` and ``revision`` are then the saga's as of the history entry before it.
    """

    index: int
    at_ms: int
    event: str
    summary: str
    effects: list[str]
    status: SagaStatus
    revision: int
    ignored: str = ""
    source: Literal["history", "task"] = "history"
    by: str = ""


def timeline_row(index: int, entry: HistoryEntry) -> TimelineRow:
    """One history entry as a line."""
    return TimelineRow(
        index=index,
        at_ms=entry.event.at_ms,
        event=_tag(entry.event),
        summary=describe_event(entry.event),
        effects=[describe_effect(e) for e in entry.effects],
        status=entry.status,
        revision=entry.revision,
        ignored=entry.ignored,
    )


_ANSWERS_THE_SAGA = frozenset({"opened", "withdrawn"})
"""Task actions that a command of the saga caused: at a tie in time they follow the history."""


def merge_task_log(rows: Sequence[TimelineRow], log: Sequence[TaskLog]) -> list[TimelineRow]:
    """The history's ``rows`` with the saga's task actions merged in by time.

    The task log is kept beside the history, not in it (``docs/human-tasks.md`` says why):
    the history stays exactly what the decider read, so replay is untouched, and readers
    show the two as one timeline. At the same millisecond, opening and withdrawing a task
    follow the history entries (the saga's command caused them); what people and the
    escalation policy do precedes them (a completion causes the saga's signal).
    """
    merged: list[TimelineRow] = []
    pending = list(rows)
    for index, entry in enumerate(log):
        follows = entry.action in _ANSWERS_THE_SAGA
        while pending and (pending[0].at_ms < entry.at_ms or (follows and pending[0].at_ms == entry.at_ms)):
            merged.append(pending.pop(0))
        before = merged[-1] if merged else None
        detail = f" ({entry.detail})" if entry.detail else ""
        merged.append(
            TimelineRow(
                index=index,
                at_ms=entry.at_ms,
                event="task",
                summary=f"task {entry.step}: {entry.action} by {entry.by}{detail}",
                effects=[],
                status=before.status if before else SagaStatus.RUNNING,
                revision=before.revision if before else 0,
                source="task",
                by=entry.by,
            )
        )
    return merged + pending


def describe_event(event: Recorded) -> str:  # noqa: PLR0911 - one line per event kind
    """An event in a few words."""
    match event:
        case Started():
            return f"started by {event.by or 'a client'}"
        case StepReplied(ok=True):
            return f"{event.step}/{event.kind} #{event.attempt} succeeded ({event.worker or '?'})"
        case StepReplied():
            kind = "permanently" if event.permanent else "transiently"
            return f"{event.step}/{event.kind} #{event.attempt} failed {kind}: {event.error}"
        case TimerFired():
            return f"{event.purpose} timer of {event.step}/{event.kind} #{event.attempt} fired"
        case CancelRequested():
            return f"cancel requested by {event.by or '?'}{_why(event.reason)}"
        case RetryRequested():
            return f"retry requested by {event.by or '?'}{_why(event.reason)}"
        case ForceCompleted():
            return f"{event.step} force-completed by {event.by}{_why(event.reason)}"
        case RedriveRequested():
            return f"redrive from {event.step} requested by {event.by}{_why(event.reason)}"
        case Migrated():
            return f"migrated from version {event.from_version} to {event.to_version} by {event.by or '?'}"
    return type(event).__name__


def describe_effect(effect: Effect) -> str:
    """An effect in a few words."""
    if isinstance(effect, Dispatch):
        return f"send {effect.step}/{effect.kind} #{effect.attempt} to {effect.participant}"
    if isinstance(effect, StartTimer):
        return f"{effect.purpose} timer {effect.step}/{effect.kind} in {human_ms(effect.delay_ms)}"
    if isinstance(effect, NotifyParent):
        return f"report the end ({effect.status}) to the parent saga"
    if isinstance(effect, WatchEvent | UnwatchEvent):
        verb = "watch" if isinstance(effect, WatchEvent) else "stop watching"
        return f"{verb} {effect.message_type} on {effect.stream} for {effect.step}"
    assert isinstance(effect, CancelTimer)  # noqa: S101 - Effect is a closed union
    return "cancel timer"


def _why(reason: str) -> str:
    return f": {reason}" if reason else ""


def _tag(event: Recorded) -> str:
    tag = type(event).__struct_config__.tag
    return tag if isinstance(tag, str) else type(event).__name__
