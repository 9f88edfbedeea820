"""Running a step's code and turning what happened into the reply the orchestrator expects.

Shared by participants' handlers and local actions, so both fail and succeed alike.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import msgspec

from bus import PermanentError, Reply
from bus.lowlevel import get_logger
from saga.runtime.protocol import StepFailed, StepSucceeded

_log = get_logger("redsaga.saga")
_json = msgspec.json.Encoder()


async def reply_for(work: Awaitable[Any], *, wrap: bool) -> Any:
    """Await ``work`` and return its reply.

    Success replies with the output (wrapped in :class:`StepSucceeded` when ``wrap`` or when
    it is ``None``) and is remembered, so a redelivery answers with the same result.
    :class:`~bus.PermanentError` replies with a permanent failure, remembered too. Any other
    exception replies with a transient failure that is *not* remembered, so the next attempt
    (same idempotency key) runs the code again.
    """
    try:
        output = await work
    except PermanentError as error:
        return StepFailed(error=str(error), error_type=type(error).__name__, permanent=True)
    except Exception as error:  # noqa: BLE001 - every other failure is transient by contract
        _log.info("step failed; the saga's retry policy decides", error=f"{type(error).__name__}: {error}")
        failure = StepFailed(error=f"{type(error).__name__}: {error}", error_type=type(error).__name__)
        return Reply(failure, remember=False)
    if wrap or output is None:
        return StepSucceeded(output=msgspec.Raw(_json.encode(output)))
    return output
