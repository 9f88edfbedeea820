"""How an orchestrator decides a client's start request, and records why it refused one.

A client that does not hold the context's orchestrator keyring asks for a saga with a
``StartRequested`` inbox entry (:meth:`saga.SagaClient.start`). The orchestrator checks who
sent it (``saga/store/trust.py``), what it names and its data, and either starts the saga in
the same transition script as any other decision, finds it started already (a repeat), or
refuses it: the refusal is kept for the client under the request's id
(``saga/runtime/start_verdict.py``) and the bus dead-letters the entry with the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from bus import Delivery, Envelope, PermanentError, TransientError
from bus.lowlevel import ScriptCall
from saga.core.decider import Decision
from saga.core.decider import start as decide_start
from saga.core.model import Started
from saga.core.tokens import Signer
from saga.definition.registry import Registry
from saga.errors import InvalidInput, SagaExists, UnknownDefinition
from saga.runtime.config import EngineConfig
from saga.runtime.protocol import to_event
from saga.runtime.start_verdict import Refusal, record_refusal
from saga.runtime.tracing import keep_trace, trace_of
from saga.store.codec import Loaded
from saga.store.keys import Partition, check_saga_id
from saga.store.trust import authorize, credited

Transition = Callable[[Partition, Loaded | None, Decision, Any, Delivery], tuple[ScriptCall, Loaded]]
"""Builds the transition call committing a decision, and the saga as it will be after it."""


class StartPlanner:
    """Decides the start requests of one context's inbox."""

    def __init__(
        self, registry: Registry, context: str, *, config: EngineConfig, transition: Transition
    ) -> None:
        self.registry = registry
        self.context = context
        self.config = config
        self.transition = transition
        """The orchestrator's transition call builder (the same for starts as for any decision)."""

    def plan(
        self,
        envelope: Envelope,
        delivery: Delivery,
        partition: Partition,
        loaded: Loaded | None,
        signer: Signer,
    ) -> tuple[Decision, ScriptCall, Loaded] | None:
        """The decision and transition call of a start request, as the saga will be after it.

        ``None`` when the saga exists with the same definition and data: the start is repeated.
        Raises :class:`SagaExists` or :class:`InvalidInput` for a request to refuse, and the
        bus's errors for one that cannot be decided here (a definition this worker lacks).
        """
        started = to_event(envelope)
        assert isinstance(started, Started)  # noqa: S101 - to_event of a start request
        event: Started = started
        name, _, version = event.saga.rpartition("@")
        try:
            definition = self.registry.get(name, int(version))
        except ValueError as error:
            raise PermanentError(f"start request names no definition: {event.saga!r}") from error
        except UnknownDefinition as error:
            raise TransientError(f"{error}; a worker serving it must take this start request") from error
        authorize(
            self.config.auth,
            self.context,
            definition,
            None,
            event,
            envelope,
            delivery.principal,
            self.registry.lineage,
        )
        if loaded is not None:
            existing = loaded.state
            if existing.name == definition.name and bytes(existing.data) == bytes(event.data):
                return None
            runs = f"{existing.name}@{existing.version}"
            raise SagaExists(f"saga {existing.id!r} exists and runs {runs} with other data")
        try:
            definition.decode_data(event.data)
        except (InvalidInput, msgspec.DecodeError) as error:
            raise InvalidInput(str(error)) from error
        event = msgspec.structs.replace(
            credited(event, delivery.principal), steps=[s.name for s in definition.steps]
        )
        decision = decide_start(
            definition,
            envelope.correlation_id,
            bytes(event.data),
            partition.index,
            event,
            signer=signer if definition.takes_signals else None,
        )
        keep_trace(decision, trace_of(envelope))  # the client's start span, from the request
        return decision, *self.transition(partition, None, decision, event, delivery)


async def refuse_start(
    redis: Any, partition: Partition, refusal: Refusal, envelope: Envelope
) -> BaseException:
    """Record why the start request ``envelope`` was refused, for its client; the error to dead-letter it.

    An error recording it is returned instead: the entry is then redelivered and refused again.
    """
    refused = PermanentError(f"start request refused: {refusal.reason}")
    try:
        request_id = check_saga_id(envelope.id)  # the same alphabet as any id in a key
        await record_refusal(redis, partition, request_id, refusal)
    except InvalidInput:
        pass  # not an id a client of ours makes: the dead letter alone says it
    except Exception as error:  # noqa: BLE001 - not recorded: redelivered, refused again
        return error
    return refused
