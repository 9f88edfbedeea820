"""Operator actions: judged locally by the decider, sent through the inbox, then awaited.

An action (cancel, retry, force-complete, redrive) is decided by the orchestrator like any
other event, in order with the replies racing it, so there is one writer per saga and one
outcome. Before sending, the admin client runs the same decider on the state it just read:
an action that would be ignored is refused at once with the decider's reason and nothing is
sent. The request carries the revision that judgement was made on; if the saga moves
before the orchestrator decides it (a late reply won the race), the request is recorded in
the history and ignored ("the saga moved on"), never applied to a state nobody looked at.

The client then watches the saga's history for the request's entry (real time: it waits for
another process) and reports what was decided, or that it is still queued.

Without the definition's code (an admin client on a :class:`~saga.versions.catalogue.Catalogue`) the decider
cannot run here: :func:`judge_by_state` refuses what the state alone shows would be ignored,
and the orchestrator, which has the code, judges the rest against the revision sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import anyio
import msgspec

from bus import Envelope, Publisher, uuid7
from bus.lowlevel import redis_errors
from saga.core.decider import Decision, decide
from saga.core.effects import Dispatch
from saga.core.history_entry import HistoryEntry
from saga.core.model import Event, SagaState, StepState
from saga.core.states import SagaStatus
from saga.core.tokens import Signer
from saga.definition.saga import Saga
from saga.errors import ActionRefused
from saga.runtime.protocol import CANCEL, FORCE, RETRY, OperatorRequest, operator_event
from saga.store.branches import load_saga
from saga.store.codec import state_write
from saga.store.history import event_id, read_history
from saga.store.keys import Partition
from saga.store.trust import inbox_audience

Outcome = Literal["applied", "queued", "dry-run"]
_json = msgspec.json.Encoder()
_LETTERS_READ = 100


class ActionResult(msgspec.Struct, kw_only=True):
    """What became of an operator action.

    Attributes:
        action: ``cancel``, ``retry``, ``force-complete`` or ``redrive``.
        saga_id: The saga acted on.
        outcome: ``applied`` (decided and applied), ``queued`` (sent; no orchestrator decided
            it within the wait: it applies when one does, unless the saga moves first) or
            ``dry-run`` (only judged; nothing was sent).
        request_id: The inbox message (and history event) id; empty for a dry run.
        by: Who asked.
        reason: Why.
        status: The saga's status after the decision (predicted for queued and dry runs).
        revision: The revision the decision produced (predicted likewise), or was judged on.
        dispatched: The commands the decision sent (or would send), one line each.

    """

    action: str
    saga_id: str
    outcome: Outcome
    request_id: str
    by: str
    reason: str
    status: SagaStatus
    revision: int
    dispatched: list[str]


@dataclass(frozen=True, slots=True)
class Action:
    """One operator action ready to judge and send: the request and the event it becomes."""

    name: str
    kind: str
    request: OperatorRequest
    event: Event

    @classmethod
    def of(cls, name: str, kind: str, request: OperatorRequest, *, at_ms: int) -> Action:
        """Build the action; its event is exactly what the orchestrator will decode."""
        return cls(name, kind, request, operator_event(kind, uuid7(), at_ms, request))


def judge(
    definition: Saga[Any], state: SagaState, action: Action, *, signer: Signer | None = None
) -> Decision:
    """Run the decider on ``state`` as the orchestrator will; refuse what it would ignore.

    ``signer`` is the context's, for sagas whose builders make resume tokens (a redrive or
    retry runs them again): without it the verdict would be that the builder failed.
    """
    decision = decide(definition, state, action.event, signer=signer)
    if decision.ignored:
        raise ActionRefused(action.name, state.id, decision.ignored)
    return decision


def judge_by_state(state: SagaState, action: Action) -> None:
    """Refuse, without the decider, what ``state`` alone shows the decider would ignore.

    An ended saga takes no action, a retry needs a dead-lettered saga, a cancel is asked
    once, and a forced step must exist; everything else is judged by the orchestrator.
    """
    reason = ""
    if action.kind == RETRY and state.status != SagaStatus.DEAD_LETTERED:
        reason = f"retry applies to dead-lettered sagas, this one is {state.status}"
    elif action.kind == FORCE and _record(state, action.request.step or "") is None:
        reason = f"no step {action.request.step!r}"
    elif state.status.terminal:
        reason = f"the saga has already ended ({state.status})"
    elif action.kind == CANCEL and state.cancel is not None:
        reason = "cancel was already requested"
    if reason:
        raise ActionRefused(action.name, state.id, reason)


async def submit(
    redis: Any,
    publisher: Publisher,
    partition: Partition,
    state: SagaState,
    action: Action,
    *,
    judged: Decision | None,
    source: str,
    wait_s: float,
    poll_s: float = 0.05,
) -> ActionResult:
    """Send a judged action on ``state`` to the saga's inbox and wait up to ``wait_s`` for its decision.

    ``judged`` is what :func:`judge` decided; it is reported (as the expected outcome) when
    the action is still queued after the wait. Without it (no code to judge with) a queued
    action reports the saga as it was read, and no commands.
    """
    saga_id = state.id
    history_key = partition.history(saga_id)
    with redis_errors():
        seen = int(await redis.llen(history_key))
        newest = await redis.xrevrange(partition.dead_letters, count=1)
    letters_after = newest[0][0] if newest else b"0-0"
    envelope = Envelope(
        id=action.event.id,
        type=action.kind,
        payload=_json.encode(action.request),
        source=source,
        correlation_id=saga_id,
        created_at_ms=action.event.at_ms,
    )
    await publisher.publish_envelope(partition.inbox, envelope, audience=inbox_audience(partition.context))
    if wait_s > 0:
        with anyio.move_on_after(wait_s):
            while True:
                with redis_errors():
                    raw = await redis.lrange(history_key, seen, -1)
                for stored in raw:
                    if event_id(stored) == action.event.id:
                        # read after the entry, the saga holds every record it refers to
                        loaded = await load_saga(redis, partition, saga_id)
                        [entry] = read_history([stored], loaded.state if loaded else state)
                        return _decided(action, saga_id, entry)
                seen += len(raw)
                letters_after = await _refusal(redis, partition, action, letters_after)
                await anyio.sleep(poll_s)
    if judged is None:
        return ActionResult(
            action=action.name,
            saga_id=saga_id,
            outcome="queued",
            request_id=action.event.id,
            by=action.request.by,
            reason=action.request.reason,
            status=state.status,
            revision=state.revision,
            dispatched=[],
        )
    return _result(action, "queued", action.event.id, state, judged)


async def _refusal(redis: Any, partition: Partition, action: Action, after: bytes) -> bytes:
    """Raise :class:`ActionRefused` if the request was dead-lettered (unsigned, forged, ...).

    Reads the partition's letters newer than ``after``; returns the newest id read.
    """
    with redis_errors():
        letters = await redis.xrange(partition.dead_letters, min=b"(" + after, count=_LETTERS_READ)
    for letter_id, fields in letters:
        if fields.get(b"message_id", b"").decode() == action.event.id:
            reason = fields.get(b"reason", b"").decode(errors="replace")
            raise ActionRefused(
                action.name,
                fields.get(b"correlation_id", b"").decode(errors="replace"),
                f"the request was dead-lettered ({reason}); see saga dlq show {letter_id.decode()}",
                request_id=action.event.id,
            )
    return letters[-1][0] if letters else after


def dry_run(action: Action, state: SagaState, judged: Decision) -> ActionResult:
    """The result of an action judged on ``state`` but not sent."""
    return _result(action, "dry-run", "", state, judged)


def _decided(action: Action, saga_id: str, entry: HistoryEntry) -> ActionResult:
    if entry.ignored:
        raise ActionRefused(action.name, saga_id, entry.ignored, request_id=entry.event.id)
    return ActionResult(
        action=action.name,
        saga_id=saga_id,
        outcome="applied",
        request_id=entry.event.id,
        by=action.request.by,
        reason=action.request.reason,
        status=entry.status,
        revision=entry.revision,
        dispatched=[describe_dispatch(e) for e in entry.effects if isinstance(e, Dispatch)],
    )


def _result(
    action: Action, outcome: Outcome, request_id: str, before: SagaState, decision: Decision
) -> ActionResult:
    """The result of ``decision``, with the revision the store will give it (``state_write``)."""
    write = state_write(before, None, decision.state, changed=decision.changed, touched=decision.touched)
    return ActionResult(
        action=action.name,
        saga_id=decision.state.id,
        outcome=outcome,
        request_id=request_id,
        by=action.request.by,
        reason=action.request.reason,
        status=decision.state.status,
        revision=write.revision,
        dispatched=[describe_dispatch(e) for e in decision.effects if isinstance(e, Dispatch)],
    )


def _record(state: SagaState, key: str) -> StepState | None:
    return state.branches.get(key) if "#" in key else state.steps.get(key)


def describe_dispatch(dispatch: Dispatch) -> str:
    """``charge_payment/do #2 -> payments ChargeCard``."""
    d = dispatch
    return f"{d.step}/{d.kind} #{d.attempt} -> {d.participant} {d.message_type}"
