"""One line of a saga's history: an event, the effects decided on it, and where it left the saga."""

from __future__ import annotations

import msgspec

from saga.core.effects import Effect
from saga.core.model import Recorded
from saga.core.states import SagaStatus


class HistoryEntry(msgspec.Struct, gc=False, kw_only=True, omit_defaults=True):
    """One line of a saga's history: the event, what was decided, and the resulting status."""

    event: Recorded
    effects: list[Effect] = msgspec.field(default_factory=list)
    status: SagaStatus
    revision: int
    ignored: str = ""
