"""The HTTP status that answers each of redsaga's errors, for any web framework.

A class not listed answers with the status of its nearest listed base class (so every
:class:`~saga.errors.SagaError` has one; an unexpected one is a 500).
"""

from __future__ import annotations

from typing import Any, Final

from bus import BusError, PayloadTooLarge, RedisUnavailable
from saga.errors import (
    ActionRefused,
    ConcurrentUpdate,
    InvalidAnswer,
    InvalidInput,
    InvalidToken,
    NotAuthorized,
    ResultTimeout,
    SagaEnded,
    SagaError,
    SagaExists,
    SagaNotFound,
    ScheduleNotFound,
    TaskAlreadyClaimed,
    TaskClosed,
    TaskNotFound,
    UnknownDefinition,
    VersionDrained,
    WaitEnded,
)

STATUSES: Final[dict[type[Exception], int]] = {
    SagaNotFound: 404,
    ScheduleNotFound: 404,
    TaskNotFound: 404,
    SagaExists: 409,  # StartConflict too: the id is taken by other data
    ConcurrentUpdate: 409,
    ActionRefused: 409,
    WaitEnded: 409,
    TaskAlreadyClaimed: 409,
    TaskClosed: 409,
    VersionDrained: 409,
    SagaEnded: 409,  # the saga ended otherwise than completed (its status is in the body)
    InvalidInput: 422,
    InvalidAnswer: 422,
    UnknownDefinition: 422,
    InvalidToken: 400,
    NotAuthorized: 403,
    PayloadTooLarge: 413,
    ResultTimeout: 504,  # still running: ask again later
    RedisUnavailable: 503,
    SagaError: 500,
    BusError: 500,
}
"""Each error class's HTTP status; what :func:`status_of` reads."""

_FIELDS: Final = ("saga_id", "status", "definition", "step", "reason", "task")


def status_of(error: Exception) -> int:
    """The HTTP status for ``error``: its class's, else its nearest listed base's, else 500."""
    for cls in type(error).__mro__:
        if cls in STATUSES:
            return STATUSES[cls]
    return 500


def body_of(error: Exception) -> dict[str, Any]:
    """A JSON body for ``error``: its class name, its message and the fields that name what it is about."""
    body: dict[str, Any] = {"error": type(error).__name__, "detail": str(error)}
    for field in _FIELDS:
        value = getattr(error, field, None)
        if isinstance(value, str) and value:
            body[field] = value
    return body
