"""The effects a decision emits: what it asks the world to do, in the same atomic commit.

Msgspec Structs like the state and events (``saga/core/model.py``); history keeps them
verbatim beside the event that caused them. Schema rules: new fields get defaults; a tag is
never reused.
"""

from __future__ import annotations

import msgspec

from saga.core.model import NULL, Kind, TimerPurpose


class Dispatch(msgspec.Struct, gc=False, tag="dispatch", kw_only=True):
    """Send an attempt's command to a participant's stream (or the local action stream)."""

    step: str
    kind: Kind
    attempt: int
    participant: str
    command_id: str
    message_type: str
    payload: msgspec.Raw
    timeout_ms: int | None = None


class StartTimer(msgspec.Struct, gc=False, tag="start_timer", kw_only=True, omit_defaults=True):
    """Schedule a durable timer ``delay_ms`` from the commit, or at ``at_ms`` (Unix ms).

    Both are judged by the timer clock (Redis ``TIME``; the fake clock in tests): the delay
    is added to that clock's time at the commit, and an absolute time is compared with it
    when firing, so no worker's clock decides when a timer is due.
    """

    timer_id: str
    delay_ms: int
    purpose: TimerPurpose
    step: str
    kind: Kind
    attempt: int
    at_ms: int | None = None


class CancelTimer(msgspec.Struct, gc=False, tag="cancel_timer", kw_only=True):
    """Remove a timer that is no longer needed."""

    timer_id: str


class WatchEvent(msgspec.Struct, gc=False, tag="watch_event", kw_only=True, omit_defaults=True):
    """Register wait ``n`` of ``step`` for events of ``message_type`` on ``stream`` with ``key``.

    ``attempt`` is the step's attempt that waits, when it is not ``n`` (a wait an operator
    redrive began again keeps its number): it keeps the registration apart from the one the
    redrive removed.
    """

    step: str
    n: int
    stream: str
    message_type: str
    key: str
    attempt: int = 0


class UnwatchEvent(msgspec.Struct, gc=False, tag="unwatch_event", kw_only=True, omit_defaults=True):
    """Remove the registration of an event wait that ended (``attempt`` as for ``WatchEvent``)."""

    step: str
    n: int
    stream: str
    message_type: str
    key: str
    attempt: int = 0


class NotifyParent(msgspec.Struct, gc=False, tag="notify_parent", kw_only=True, omit_defaults=True):
    """A child saga ended: report it to the parent step that waits for it.

    ``ok`` with the child's output (its last step's output), or the reason it did not
    complete. Written on the child's own inbox (a ``ParentReport`` entry, same slot as the
    transition); the child's orchestrator forwards it to the parent's inbox (another slot).
    """

    status: str
    ok: bool
    output: msgspec.Raw = NULL
    error: str = ""


Effect = Dispatch | StartTimer | CancelTimer | WatchEvent | UnwatchEvent | NotifyParent


def idempotency_key(saga_id: str, step: str, kind: Kind, generation: int = 0) -> str:
    """The key a step's commands carry: stable across retries and redeliveries.

    ``<saga id>:<step>:<do|undo>``, with ``:g<n>`` appended once a redrive started a new
    generation of the step (see :attr:`StepState.generation`).
    """
    key = f"{saga_id}:{step}:{kind}"
    return f"{key}:g{generation}" if generation else key
