"""The in-process runner's participants: delivering commands as the bus's consumer would.

The bus's idempotent consumer is a dict from (participant, idempotency key) to the first
result, so a repeat is answered without running the handler again, as in production --
and, as in production, forgotten ``BusConfig.dedupe_ttl_s`` (virtual time) later. Replies
go through the code a real participant's reply goes through (``reply_for``, the bus's
result encoding and reply envelope, ``to_event``); local actions run on a real
:class:`~saga.runtime.local_actions.LocalActions`, as the orchestrator's worker runs them;
``cmd:_child`` commands go to the runner's child sagas.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bus import Delivery, Envelope, FakeClock, MalformedEntry, Reply
from bus.lowlevel import encode_result, reply_envelope
from saga.core.child_messages import CHILD
from saga.core.commands import LocalCall
from saga.core.model import SagaState, StepReplied
from saga.core.tokens import Signer
from saga.definition.registry import Registry
from saga.definition.saga import LOCAL
from saga.errors import RunnerError
from saga.runtime.config import EngineConfig
from saga.runtime.local_actions import LocalActions
from saga.runtime.participant import CommandContext
from saga.runtime.protocol import StepFailed, to_event
from saga.runtime.step_reply import reply_for
from saga.testing.fakes import Call, CallOutcome, FakeParticipant, Response
from saga.testing.runner_queue import CONSUMER, CommandItem, EventItem, Held, Item


def local_actions(registry: Registry, signer: Callable[[str], Signer]) -> dict[str, LocalActions]:
    """Each context's local actions, making tokens with ``signer`` of the context."""

    def signer_of(context: str) -> Callable[[], Awaitable[Signer]]:
        made = signer(context)

        async def ready() -> Signer:
            return made

        return ready

    return {name: LocalActions(registry, signer_of(name)) for name in registry.contexts}


@dataclass
class Deliveries:
    """Commands delivered to participants, their replies queued (or held back, or lost)."""

    participants: Mapping[str, FakeParticipant]
    config: EngineConfig
    clock: FakeClock
    locals: Mapping[str, LocalActions]
    """Each context's local actions (see :func:`local_actions`)."""
    enqueue: Callable[[Item], None]
    child_command: Callable[[Envelope], None]
    ids: itertools.count[int]
    calls: list[Call] = field(default_factory=list)
    """Every command delivered to a participant (local actions aside), in delivery order."""
    paused: dict[str, list[CommandItem]] = field(default_factory=dict)
    held: list[Held] = field(default_factory=list)
    dedupe: dict[tuple[str, str], tuple[bytes, int]] = field(default_factory=dict)

    def participant(self, name: str) -> FakeParticipant:
        """The participant called ``name``."""
        try:
            return self.participants[name]
        except KeyError:
            known = ", ".join(sorted(self.participants)) or "none"
            raise RunnerError(
                f"no participant {name!r} (known: {known}): give the runner its fake",
                participant=name,
            ) from None

    def resume(self, name: str) -> None:
        """Queue a paused participant's backlog, in order."""
        for command in self.paused.pop(name, []):
            self.enqueue(command)

    async def handle(self, command: CommandItem) -> None:
        """Deliver one command as the bus would: idempotent consumer first, then the handler."""
        envelope = command.envelope
        name = command.participant
        if name in self.paused:
            self.paused[name].append(command)
            return
        delivery = Delivery(
            envelope=envelope,
            stream=command.partition.commands(name),
            group=name,
            entry_id=f"0-{next(self.ids)}",
            deliveries=1,
            consumer=CONSUMER,
        )
        key = (name, envelope.idempotency_key)
        if name == CHILD:
            self.child_command(envelope)
            return
        if name == LOCAL:
            first = self._first_result(key)
            if first is None:
                local = self.locals[command.partition.context]
                reply = await local.run(envelope.decode(LocalCall), delivery)
                first = self._result(key, reply, idempotent=True)
            self._reply(command, LOCAL, first, Response(None))
            return
        fake = self.participant(name)
        found = fake.behaviour(envelope.type)
        if found is None:
            raise RunnerError(
                f"participant {name!r} has no behaviour for {envelope.type} (sent by step "
                f"{envelope.headers.get('step')!r}); add one with .on({envelope.type}, ...)",
                participant=name,
                saga_id=command.saga_id,
            )
        message = envelope.decode(found[0])
        ctx = CommandContext.of(delivery)
        first = self._first_result(key) if fake.idempotent else None
        if first is not None:
            fake.calls.append(self._call(name, message, ctx, envelope, "replayed"))
            self._reply(command, name, first, Response(None))
            return
        response = found[1].respond(message, ctx)
        if response.handler is None:
            fake.calls.append(self._call(name, message, ctx, envelope, "lost"))
        else:
            reply = await reply_for(response.handler(message, ctx), wrap=False)
            result = self._result(key, reply, idempotent=fake.idempotent)
            fake.calls.append(self._call(name, message, ctx, envelope, _outcome_of(reply)))
            self._reply(command, name, result, response)
        if response.redeliver:
            self.enqueue(command)

    def effects_twice(self) -> list[str]:
        """What each participant applied twice for one idempotency key (nothing, normally)."""
        problems = []
        for fake in self.participants.values():
            try:
                fake.assert_each_effect_once()
            except AssertionError as error:
                problems.append(str(error))
        return problems

    def release_late(self, state: SagaState) -> None:
        """Queue held replies whose attempt the saga has given up on (timed out, moved on)."""
        keep: list[Held] = []
        for held in self.held:
            mine = held.item.saga_id == state.id
            step = (state.steps.get(held.step) or state.branches.get(held.step)) if mine else None
            attempt = step.current(held.kind) if step is not None else None
            if not mine or (
                attempt is not None and attempt.command_id == held.command_id and attempt.outcome is None
            ):
                keep.append(held)
            else:
                self.enqueue(held.item)
        self.held = keep

    def _first_result(self, key: tuple[str, str]) -> bytes | None:
        """The key's first result, unless the bus would have forgotten it (``dedupe_ttl_s``)."""
        recorded = self.dedupe.get(key)
        if recorded is None or self.clock.now_ms() - recorded[1] >= self.config.bus.dedupe_ttl_s * 1000:
            return None
        return recorded[0]

    def _result(self, key: tuple[str, str], reply: Any, *, idempotent: bool) -> bytes:
        """Encode a handler's reply; remember it as the key's first result as the bus does."""
        result = encode_result(reply, self.config.bus)
        if idempotent and (not isinstance(reply, Reply) or reply.remember):
            self.dedupe[key] = (result, self.clock.now_ms())
        return result

    def _call(
        self, name: str, message: Any, ctx: CommandContext, envelope: Envelope, outcome: CallOutcome
    ) -> Call:
        call = Call(
            participant=name,
            message=message,
            saga_id=ctx.saga_id,
            step=ctx.step,
            kind=ctx.kind,
            attempt=ctx.attempt,
            command_id=envelope.id,
            idempotency_key=envelope.idempotency_key,
            at_ms=self.clock.now_ms(),
            outcome=outcome,
        )
        self.calls.append(call)
        return call

    def _reply(self, command: CommandItem, name: str, result: bytes, response: Response) -> None:
        reply = reply_envelope(
            command.envelope, result, source=name, consumer=f"{name}@{CONSUMER}", now_ms=self.clock.now_ms()
        )
        if reply is None:
            return
        try:
            event = to_event(reply)
        except MalformedEntry as error:
            raise RunnerError(
                f"participant {name!r} replied with something unusable: {error}",
                participant=name,
                saga_id=command.saga_id,
            ) from error
        item = EventItem(command.saga_id, event, reply)
        assert isinstance(event, StepReplied)  # noqa: S101 - replies always decode as StepReplied
        for _ in range(max(1, response.copies)):
            if response.late:
                self.held.append(Held(item, event.step, event.kind, event.command_id))
            else:
                self.enqueue(item)


def _outcome_of(reply: Any) -> CallOutcome:
    message = reply.message if isinstance(reply, Reply) else reply
    if isinstance(message, StepFailed):
        return "permanent" if message.permanent else "transient"
    return "ok"
