"""Local actions: steps (and compensations) the orchestrator's own worker runs.

A local step's command goes on the partition's ``cmd:_local`` stream like any participant's;
the orchestrator's worker consumes it and runs the step's code here, replying as a
participant would (``saga/runtime/step_reply.py``), so the saga cannot tell the two apart.
The step's context can make resume tokens for the signal waits the command names.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from bus import Delivery, PermanentError, TransientError
from saga.core.commands import LocalCall
from saga.core.tokens import Signer
from saga.definition.registry import Registry
from saga.definition.saga import StepContext, invoke
from saga.errors import UnknownDefinition
from saga.runtime.tracing import traced_reply


class LocalActions:
    """Runs the local actions of the definitions in ``registry``.

    ``signer`` returns the context's resume-token signer; it is asked only for a command
    whose step may make tokens.
    """

    def __init__(self, registry: Registry, signer: Callable[[], Awaitable[Signer]]) -> None:
        self.registry = registry
        self._signer = signer

    async def run(self, call: LocalCall, delivery: Delivery) -> Any:
        """Run a local action (or a local compensation) and reply like a participant."""
        headers = delivery.envelope.headers
        name, _, version = headers.get("saga", "").rpartition("@")
        try:
            definition = self.registry.get(name, int(version))
            step = definition.step_named(headers.get("step", ""))
        except (UnknownDefinition, KeyError, ValueError) as error:
            raise TransientError(f"cannot run local action: {error}") from error
        target = step if headers.get("kind") == "do" else step.compensation
        if target is None:
            raise PermanentError(f"{definition.key}.{step.name} has no local compensation")
        saga_id = delivery.envelope.correlation_id
        signer = await self._signer() if call.waits else None
        partition = int(delivery.stream.tag.rsplit(":", 1)[1])

        def token(name: str) -> str:
            if signer is None or name not in call.waits:
                raise KeyError(f"{definition.key}.{name} does not wait for a signal")
            return signer.token(
                partition, saga_id, name, call.waits[name], incarnation=call.incarnation, now_ms=call.at_ms
            )

        context = StepContext(
            saga_id,
            headers.get("step", ""),  # a branch's key, <group>#<index>: ctx.branch and ctx.item
            delivery.envelope.attempt,
            {k: bytes(v) for k, v in call.outputs.items()},
            token,
        )
        data = definition.decode_data(call.data)
        return await traced_reply(delivery.envelope, invoke(target, data, context), wrap=True)
