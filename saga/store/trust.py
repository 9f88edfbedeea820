"""Who may send what to an orchestrator, and how the engine signs what it writes.

The bus checks that an inbox entry is signed for the context's orchestrator
(``orchestrator:<context>``) by the principal it names (``bus/_auth.py``); this module decides
whether that principal may send that kind of entry about that saga:

=====================================  ================================================
entry                                  may be signed by
=====================================  ================================================
a step's reply (success or failure)    the participant the step's command went to
                                       (``participant:<name>``); the orchestrator
                                       itself for local actions
a timer firing, a matched event        the orchestrator itself
a child step's reply (its child ended)  the orchestrator of the child's context
a signal                               anyone who signs (the resume token is the
                                       capability; the orchestrator checks it)
a start request                        a client, an operator, the context's own
                                       orchestrator, or the orchestrator of the context
                                       its parent link names (a parent starting its
                                       child) if that context's sagas run the definition
                                       as a child, never one of this context's child
                                       contexts
a cancel request                       a client, an operator, the context's own
                                       orchestrator, or the orchestrator of the saga's
                                       parent's context if that context's sagas run the
                                       definition as a child
retry, force-complete, redrive         an operator
=====================================  ================================================

Whether a context's sagas run a definition as a child is what the worker's registry knows
(:class:`~saga.definition.lineage.Lineage`): the child steps of that context's definitions
when it holds them, or the ``parents=`` the definition declares. When it knows neither, the
start or cancel is accepted and logged once per parent and definition (declare ``parents=``).

Anything else is refused with :class:`bus.Unauthenticated` (dead-lettered with the reason,
nothing changed); in ``log`` mode the refusal is reported and the entry goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec

from bus import Authenticator, Envelope, Unauthenticated
from bus.lowlevel import get_logger, role_of
from saga.core.child_messages import CHILD
from saga.core.model import (
    CancelRequested,
    Event,
    EventReceived,
    ForceCompleted,
    RedriveRequested,
    RetryRequested,
    SagaState,
    SignalReceived,
    Started,
    StepReplied,
    TimerFired,
)
from saga.definition.lineage import Lineage
from saga.definition.saga import LOCAL, Saga

_log = get_logger("redsaga.saga")
_NO_LINEAGE: Final = Lineage(())
"""What a check knows without a registry: only what a definition declares."""


def orchestrator_of(context: str) -> str:
    """The principal of a context's orchestrator."""
    return f"orchestrator:{context}"


def participant_named(name: str) -> str:
    """The principal of a participant."""
    return f"participant:{name}"


@dataclass(frozen=True, slots=True)
class Seal:
    """Signs what one principal writes (``Seal(auth, principal)``; a no-op with signing off)."""

    auth: Authenticator
    principal: str

    @property
    def enabled(self) -> bool:
        """Whether anything is signed."""
        return self.auth.enabled

    def sign(self, envelope: Envelope, audience: str) -> Envelope:
        """``envelope`` signed by this principal for ``audience``."""
        return self.auth.sign(envelope, audience, self.principal)

    def fields(self, envelope: Envelope, audience: str) -> bytes:
        """The key id and MAC of ``envelope`` signed for ``audience``.

        As ``b'<k> <mac>'`` (the MAC's raw bytes after the first space: a key id has none):
        what a timer stores for the script that fires it (``b""`` when signing is off); the
        script is given ``p``, this principal (a context's orchestrator).
        """
        if not self.auth.enabled:
            return b""
        signed = self.sign(envelope, audience)
        return signed.key_id.encode() + b" " + signed.mac


def inbox_audience(context: str) -> str:
    """Whom an entry on a partition inbox of ``context`` is signed for: its orchestrator."""
    return orchestrator_of(context)


E = TypeVar("E", bound=Event)


def credited(event: E, signer: str) -> E:
    """``event`` with its ``by`` naming the principal that signed it.

    ``by`` becomes ``<as claimed> via <principal>``, so the history credits whoever really
    sent it.
    """
    by = getattr(event, "by", None)
    if not signer or by is None or by == signer or by.endswith(f" via {signer}"):
        return event
    return msgspec.structs.replace(event, by=f"{by} via {signer}" if by else signer)


def authorize(  # noqa: PLR0917 - called twice, by the orchestrator
    auth: Authenticator,
    context: str,
    definition: Saga[Any],
    state: SagaState | None,
    event: Event,
    envelope: Envelope,
    signer: str,
    lineage: Lineage = _NO_LINEAGE,
) -> None:
    """Refuse ``event`` (from ``envelope``, signed by ``signer``) unless its signer may send it.

    ``lineage`` is what the registry knows of parents and children (``Registry.lineage``):
    the contexts ``context``'s sagas run children in may report their children's ends here,
    never start or cancel a saga here; another context may start and cancel only the
    definitions its sagas run as children. Raises :class:`bus.Unauthenticated` in
    ``require`` mode, logs in ``log`` mode; with signing off nothing is checked.
    """
    if not auth.enabled:
        return
    allowed = allowed_senders(context, definition, state, event, lineage)
    parent = _parent_context(context, state, event)
    if allowed is None or _matches(signer, allowed):
        if parent is not None and signer == orchestrator_of(parent):
            _note_unchecked(context, definition, parent, lineage)
        return
    reason = (
        f"{envelope.type} for saga {envelope.correlation_id} signed by {signer or 'nobody'}, "
        f"which may not send it (only {', '.join(sorted(allowed))})"
    )
    if (
        parent is not None
        and signer == orchestrator_of(parent)
        and lineage.may_start(parent, definition) is False
    ):
        reason = (
            f"{envelope.type} for saga {envelope.correlation_id} signed by {signer}, which may "
            f"not send it: {lineage.refusal(parent, definition)}"
        )
    if auth.mode == "require":
        raise Unauthenticated(reason, signer)
    _log.warning("unauthorised entry accepted (verification mode 'log')", reason=reason)


def _note_unchecked(context: str, definition: Saga[Any], parent: str, lineage: Lineage) -> None:
    """Log, once per parent and definition, a start or cancel by ``parent`` nothing here could check."""
    if lineage.may_start(parent, definition) is None and lineage.first_unchecked(parent, definition):
        _log.warning(
            "a start or cancel by another context accepted unchecked: declare parents= on the definition",
            context=context,
            parent=parent,
            saga=definition.key,
            fix=f"Saga({definition.name!r}, ..., parents=({parent!r},)), or register {parent}'s "
            "definitions in this worker's app",
        )


INCARNATION: Final = "inc"
"""The command header naming the saga's incarnation (its creation time, ms), which the reply
carries back: a reply to a saga that has since ended and been started again under the same id
names the earlier incarnation."""


def check_fresh(
    state: SagaState, event: Event, envelope: Envelope, stamps: tuple[int, int], *, pending: bool
) -> None:
    """Refuse a reply or timer firing of another incarnation, or a timer firing not yet fired.

    Both are what a genuine, signed entry replayed does: into a later saga started under the
    same id, or read from the pending timers and added to the inbox before the scheduler
    fired it. ``stamps`` are the incarnation and due time the entry carries under its MAC
    (:func:`saga.store.commit.stamps_of`); ``pending`` says whether the timer the entry names
    is still in the partition's timers (the script that fires a timer removes it in the same
    step, judged by the one timer clock, so a genuine firing never finds it there). Raises
    :class:`bus.Unauthenticated` (dead-lettered with the reason). A reply without the header
    or a timer firing without the times (written before they were recorded) is left to the
    decider's match on the attempt or the timer id only in a saga started before they were
    (one not :attr:`~saga.core.model.SagaState.stamped`); a stamped saga refuses it.
    """
    if not isinstance(event, StepReplied | TimerFired):
        return
    created, due = stamps
    if state.stamped and not (created and (due or isinstance(event, StepReplied))):
        raise Unauthenticated(
            f"{envelope.type} for saga {state.id} names no incarnation, but every entry of this "
            f"saga does (it was created at {state.created_ms}): a replay of an entry written "
            "before incarnations were stamped",
            envelope.signer,
        )
    if created and created != state.created_ms:
        raise Unauthenticated(
            f"{envelope.type} for saga {state.id} belongs to its incarnation created at {created}, "
            f"not the current one (created at {state.created_ms}): a replay",
            envelope.signer,
        )
    if isinstance(event, TimerFired) and pending:
        raise Unauthenticated(
            f"{envelope.type} {envelope.id} for saga {state.id} arrived while the timer is still "
            f"pending (due at {due or 'a time not recorded'}): fired early, not by the scheduler",
            envelope.signer,
        )


def _matches(signer: str, allowed: set[str]) -> bool:
    return bool(signer) and (signer in allowed or "*" in allowed or f"{role_of(signer)}:*" in allowed)


_REQUESTERS: Final = frozenset({"client:*", "operator:*"})
"""Who may request a start or a cancel, besides orchestrators (:func:`allowed_senders`)."""
_SENDERS: Final[dict[type[Any], frozenset[str]]] = {
    SignalReceived: frozenset({"*"}),
    RetryRequested: frozenset({"operator:*"}),
    ForceCompleted: frozenset({"operator:*"}),
    RedriveRequested: frozenset({"operator:*"}),
}


def allowed_senders(
    context: str,
    definition: Saga[Any],
    state: SagaState | None,
    event: Event,
    lineage: Lineage = _NO_LINEAGE,
) -> set[str] | None:
    """The principals that may send ``event``.

    ``role:*`` means any principal of that role, ``*`` anyone who signs; ``None``: not
    checked here. ``lineage``: who runs which definitions as children.
    An orchestrator acts on its own context's sagas; another context's may start a child
    of its own saga here (the start's parent link names its context, which is not one this
    context runs children in) and cancel a saga whose parent is in its context, nothing
    else, and only a definition its sagas run as a child (or that nothing here can check:
    :meth:`Lineage.may_start` is ``None``).
    """
    me = orchestrator_of(context)
    if isinstance(event, Started | CancelRequested):
        parent = _parent_context(context, state, event)
        if parent is None or lineage.may_start(parent, definition) is False:
            return {*_REQUESTERS, me}
        if isinstance(event, Started) and parent in lineage.child_contexts(context):
            return {*_REQUESTERS, me}
        return {*_REQUESTERS, me, orchestrator_of(parent)}
    if isinstance(event, StepReplied):
        return {me} if state is None else _repliers(me, definition, state, event)
    if isinstance(event, TimerFired | EventReceived):
        return {me}
    fixed = _SENDERS.get(type(event))
    return None if fixed is None else set(fixed)


def _parent_context(context: str, state: SagaState | None, event: Event) -> str | None:
    """The other context a start's parent link (a cancel's saga's parent) names, if any."""
    if isinstance(event, Started):
        link = event.parent
    elif isinstance(event, CancelRequested) and state is not None:
        link = state.parent
    else:
        return None
    return link.context if link is not None and link.context != context else None


def _repliers(me: str, definition: Saga[Any], state: SagaState, event: StepReplied) -> set[str]:
    """Who may reply to the attempt ``event`` names: the participant its command went to."""
    record = state.steps.get(event.step) or state.branches.get(event.step)
    attempt = next((a for a in (record.attempts if record else ()) if a.command_id == event.command_id), None)
    if attempt is None:  # names no attempt: the decider records it as ignored
        return {me, "participant:*"}
    if attempt.participant == LOCAL:
        return {me}
    if attempt.participant == CHILD:  # the child's orchestrator forwards its end (or we refuse it)
        steps = [*definition.steps, *definition.branch_steps()]
        return {me} | {orchestrator_of(s.child.definition.context.name) for s in steps if s.child is not None}
    return {participant_named(attempt.participant)}
