"""The test runner's child sagas (an object ``SagaRunner`` composes).

A ``cmd:_child`` command is handled as the orchestrator handles it -- ``StartChild`` starts
the child (idempotent by its id) with the link to its parent, ``CancelChild`` queues a
cancel for it -- and a child's end report becomes the parent's reply through the same
:func:`~saga.runtime.children.parent_reply` the orchestrator forwards, so the parent decides the
same reply either way. The child's definition must be given to the runner too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from bus import Envelope, FakeClock
from saga.core.child_messages import CancelChild, StartChild
from saga.core.effects import NotifyParent
from saga.core.model import CancelRequested, ParentLink, SagaState
from saga.definition.composition import child_output_type
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.errors import ChildError, UnknownDefinition
from saga.runtime.children import NOT_STARTED, child_definition, not_started, parent_reply
from saga.runtime.protocol import to_event
from saga.store.commit import ParentReport
from saga.testing.runner_queue import EventItem, Item

_start = msgspec.json.Decoder(StartChild)
_cancel = msgspec.json.Decoder(CancelChild)


@dataclass
class Children:
    """Child sagas for :class:`~saga.testing.SagaRunner`: what it needs of the runner, given."""

    registry: Registry
    clock: FakeClock
    has_saga: Callable[[str], bool]
    new_id: Callable[[str], str]
    enqueue: Callable[[Item], None]
    start_linked: Callable[[bytes, Saga[Any], str, ParentLink | None], str]
    """Start a saga (data, definition, id, link to its parent); the runner's ``_start_linked``."""

    def command(self, envelope: Envelope) -> None:
        """Handle a ``cmd:_child`` command (start or cancel a child saga)."""
        definition = child_definition(self.registry, envelope)
        try:
            self.registry.get(definition.name, definition.version)
        except UnknownDefinition:
            raise ChildError(definition.key, saga_id=envelope.correlation_id) from None
        if envelope.type == "StartChild":
            command = _start.decode(envelope.payload)
            try:
                self.start_linked(bytes(command.data), definition, command.saga_id, command.parent)
            except NOT_STARTED as error:
                self._report(not_started(command, error), None)
            return
        cancel = _cancel.decode(envelope.payload)
        if self.has_saga(cancel.saga_id):
            request = CancelRequested(
                id=self.new_id("cancel-child"),
                at_ms=self.clock.now_ms(),
                by="parent saga",
                reason=cancel.reason,
            )
            self.enqueue(EventItem(cancel.saga_id, request))

    def notify_parent(self, state: SagaState, effect: NotifyParent, definition: Saga[Any]) -> None:
        """A child ended: its parent gets the reply the orchestrator would forward."""
        assert state.parent is not None  # noqa: S101 - only child sagas notify
        report = ParentReport(
            child=state.id,
            saga=definition.key,
            parent=state.parent,
            status=effect.status,
            ok=effect.ok,
            output=effect.output,
            error=effect.error,
        )
        self._report(report, child_output_type(definition) if effect.ok else None)

    def _report(self, report: ParentReport, output_type: Any) -> None:
        if not self.has_saga(report.parent.saga_id):
            return  # the parent lives elsewhere (not in this runner)
        reply = parent_reply(report, output_type, source=report.child, now_ms=self.clock.now_ms())
        self.enqueue(EventItem(report.parent.saga_id, to_event(reply), reply))
