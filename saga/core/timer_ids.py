"""The ids the decider gives its timers, in one place: the store derives them again.

A timer's id is fixed by what it is for, so a decision repeated after a crash starts the same
timer, and the store can leave a derivable id out of what it writes (the step records, the
history) and make it again on reading.
"""

from __future__ import annotations


def attempt_timer_id(saga_id: str, step: str, kind: str, attempt: int, purpose: str) -> str:
    """An attempt's timer (a timeout, a retry, a wait's): ``<saga id>:<step>:<kind>:<n>:<purpose>``."""
    return f"{saga_id}:{step}:{kind}:{attempt}:{purpose}"


def deadline_timer_id(saga_id: str) -> str:
    """The id of a saga's deadline timer."""
    return f"{saga_id}:deadline"


def attempt_of_timer(saga_id: str, timer_id: str) -> tuple[str, str, int, str] | None:
    """``(step, kind, attempt, purpose)`` of an :func:`attempt_timer_id` of ``saga_id`` (else ``None``)."""
    prefix = saga_id + ":"
    parts = timer_id.removeprefix(prefix).rsplit(":", 3)
    if not timer_id.startswith(prefix) or len(parts) != 4 or not parts[2].isdigit():
        return None
    step, kind, attempt, purpose = parts
    return step, kind, int(attempt), purpose
