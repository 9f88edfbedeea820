"""The test runner's child sagas (part of ``SagaRunner``).

A ``cmd:_child`` command is handled as the orchestrator handles it -- ``StartChild`` starts
the child (idempotent by its id) with the link to its parent, ``CancelChild`` queues a
cancel for it -- and a child's end report becomes the parent's reply through the same
:func:`~saga.runtime.children.parent_reply` the orchestrator forwards, so the parent decides the
same reply either way. The child's definition must be given to the runner too.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bus import Envelope
from saga.core.child_messages import CancelChild, StartChild
from saga.core.model import CancelRequested, Event, NotifyParent, SagaState
from saga.definition.composition import child_output_type
from saga.definition.registry import Registry
from saga.errors import InvalidInput, SagaError, SagaExists, UnknownDefinition, VersionDrained
from saga.runtime.children import child_definition, parent_reply
from saga.runtime.protocol import to_event
from saga.store.commit import ParentReport

_start = msgspec.json.Decoder(StartChild)
_cancel = msgspec.json.Decoder(CancelChild)


class ChildError(SagaError):
    """A child saga's definition was not given to the runner."""


class RunnerChildren:
    """Child sagas for :class:`~saga.testing.SagaRunner`."""

    registry: Registry

    @property
    def now_ms(self) -> int:
        """The virtual time (provided by the runner)."""
        raise NotImplementedError

    def _has_saga(self, saga_id: str) -> bool:
        raise NotImplementedError

    def _new_id(self, label: str) -> str:
        raise NotImplementedError

    def _enqueue_event(self, saga_id: str, event: Event) -> None:
        raise NotImplementedError

    def _enqueue_reply(self, saga_id: str, event: Event, envelope: Envelope) -> None:
        raise NotImplementedError

    def _start_linked(self, data: bytes, definition: Any, saga_id: str, parent: Any) -> str:
        raise NotImplementedError

    def _child_command(self, envelope: Envelope) -> None:
        """Handle a ``cmd:_child`` command (start or cancel a child saga)."""
        definition = child_definition(self.registry, envelope)
        try:
            self.registry.get(definition.name, definition.version)
        except UnknownDefinition:
            raise ChildError(
                f"give the runner the child saga {definition.key} too (SagaRunner(parent, child, ...))"
            ) from None
        if envelope.type == "StartChild":
            command = _start.decode(envelope.payload)
            try:
                self._start_linked(bytes(command.data), definition, command.saga_id, command.parent)
            except (InvalidInput, SagaExists, VersionDrained) as error:
                report = ParentReport(
                    child=command.saga_id,
                    saga=command.saga,
                    parent=command.parent,
                    status="not_started",
                    ok=False,
                    error=f"child saga {command.saga_id} could not start: {type(error).__name__}: {error}",
                )
                self._deliver_report(report, None)
            return
        cancel = _cancel.decode(envelope.payload)
        if self._has_saga(cancel.saga_id):
            request = CancelRequested(
                id=self._new_id("cancel-child"), at_ms=self.now_ms, by="parent saga", reason=cancel.reason
            )
            self._enqueue_event(cancel.saga_id, request)

    def _notify_parent(self, state: SagaState, effect: NotifyParent, definition: Any) -> None:
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
        self._deliver_report(report, child_output_type(definition) if effect.ok else None)

    def _deliver_report(self, report: ParentReport, output_type: Any) -> None:
        if not self._has_saga(report.parent.saga_id):
            return  # the parent lives elsewhere (not in this runner)
        reply = parent_reply(report, output_type, source=report.child, now_ms=self.now_ms)
        self._enqueue_reply(report.parent.saga_id, to_event(reply), reply)
