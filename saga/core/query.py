"""Queries: what a saga is doing and what it waits for, read without disturbing it.

:func:`describe` is pure: the client feeds it the stored state and the due times of the
saga's timers (read from the timers set, so "until" is what the timer clock will judge),
the test runner feeds it its own; both answer alike.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from saga.core.model import Note, SagaState, WaitKind
from saga.core.states import SagaStatus
from saga.core.timer_ids import deadline_timer_id
from saga.core.tokens import Signer


class WaitInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a suspended saga waits for.

    Attributes:
        kind: ``sleep``, ``signal`` or ``event``.
        step: The waiting step.
        n: Which wait of that step (1 unless it was retried).
        since_ms: When the wait began (Unix ms).
        until_ms: When it ends by the timer clock: the sleep's end, or the signal's or
            event's timeout (``None``: it waits as long as it takes).
        token: The resume token (signal waits, when the context's secret is available).
        stream: The event stream (event waits).
        message_type: The awaited event's type (event waits).
        key: The correlation key the event must carry (event waits).

    """

    kind: WaitKind
    step: str
    n: int
    since_ms: int
    until_ms: int | None = None
    token: str | None = None
    stream: str = ""
    message_type: str = ""
    key: str = ""


class SagaQuery(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A saga's status, its current step and wait, and its deadline."""

    id: str
    name: str
    version: int
    status: SagaStatus
    step: str | None = None
    wait: WaitInfo | None = None
    deadline_ms: int | None = None
    expired: Note | None = None
    cancel: Note | None = None
    error: Note | None = None
    updated_ms: int = 0


def timer_ids(state: SagaState) -> list[str]:
    """The timers a query needs the due time of: the current wait's and the deadline."""
    ids = [deadline_timer_id(state.id)]
    if state.wait is not None:
        timer = state.steps[state.wait.step].timer
        if timer is not None:
            ids.append(timer)
    return ids


def describe(state: SagaState, due: Mapping[str, int], signer: Signer | None, steps: list[str]) -> SagaQuery:
    """Describe ``state``; ``due`` maps pending timer ids to due times, ``steps`` is the step order."""
    step = steps[state.cursor] if state.cursor < len(steps) and not state.status.terminal else None
    wait = None
    if state.wait is not None:
        w = state.wait
        timer = state.steps[w.step].timer
        wait = WaitInfo(
            kind=w.kind,
            step=w.step,
            n=w.n,
            since_ms=w.since_ms,
            until_ms=due.get(timer) if timer else None,
            token=signer.token(
                state.partition, state.id, w.step, w.n, incarnation=state.created_ms, now_ms=w.since_ms
            )
            if signer and w.kind == "signal"
            else None,
            stream=w.stream,
            message_type=w.message_type,
            key=w.key,
        )
    return SagaQuery(
        id=state.id,
        name=state.name,
        version=state.version,
        status=state.status,
        step=step,
        wait=wait,
        deadline_ms=due.get(deadline_timer_id(state.id)),
        expired=state.expired,
        cancel=state.cancel,
        error=state.error,
        updated_ms=state.updated_ms,
    )
