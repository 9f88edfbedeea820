"""The test runner's schedules (an object ``SagaRunner`` composes): the same planner as Redis.

:meth:`SagaRunner.advance` fires schedule occurrences at their due times like timers;
:meth:`SagaRunner.run_until_settled` only fires what is due as it skips from timer to timer
(a cron schedule never settles).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bus import FakeClock
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.definition.schedule import Schedule, ScheduleState, first_state, plan
from saga.errors import InvalidInput, ScheduleExists, ScheduleNotFound
from saga.runtime.config import EngineConfig


@dataclass(slots=True)
class _Stored:
    schedule: Schedule
    state: ScheduleState
    due_ms: int | None


@dataclass
class Schedules:
    """Schedules for :class:`~saga.testing.SagaRunner`: what it needs of the runner, given."""

    registry: Registry
    config: EngineConfig
    clock: FakeClock
    start: Callable[[object, Saga[Any], str], str]
    """Start a saga (data, definition, id); the runner's ``start``."""
    cancel: Callable[[str, str, str], None]
    """Cancel a saga (id, reason, by)."""
    ended: Callable[[str], bool]
    """Whether a saga of this runner ended (or is not one of its own)."""
    stored: dict[str, _Stored] = field(default_factory=dict)

    def add_schedule(self, schedule: Schedule, *, replace: bool = False) -> None:
        """Store a schedule; its first occurrence is the first one at or after now."""
        if schedule.id in self.stored and not replace:
            raise ScheduleExists(f"schedule {schedule.id!r} exists")
        definition = self.registry.latest(schedule.saga)
        if definition.context.name != schedule.context:
            raise InvalidInput(
                f"schedule {schedule.id!r}: {schedule.saga} runs in {definition.context.name!r}"
            )
        definition.encode_data(schedule.data)
        state = first_state(schedule, self.clock.now_ms())
        self.stored[schedule.id] = _Stored(schedule, state, state.next_ms)

    def schedule_state(self, schedule_id: str) -> ScheduleState:
        """A copy of the schedule's state (what it started, skipped, buffered)."""
        stored = self._of(schedule_id)
        return msgspec.json.decode(msgspec.json.encode(stored.state), type=ScheduleState)

    def pause_schedule(self, schedule_id: str) -> None:
        """Pause: occurrences are skipped until :meth:`resume_schedule`."""
        stored = self._of(schedule_id)
        stored.state.paused = True
        stored.due_ms = None

    def resume_schedule(self, schedule_id: str) -> None:
        """Resume from the next occurrence after now."""
        stored = self._of(schedule_id)
        stored.state.paused = False
        stored.state.next_ms = stored.schedule.next_after(self.clock.now_ms())
        stored.due_ms = stored.state.next_ms

    def trigger_schedule(self, schedule_id: str) -> None:
        """Run once now (the overlap policy applies) on the next run or advance."""
        stored = self._of(schedule_id)
        stored.state.triggers.append(self.clock.now_ms())
        stored.due_ms = self.clock.now_ms()

    def _of(self, schedule_id: str) -> _Stored:
        try:
            return self.stored[schedule_id]
        except KeyError:
            raise ScheduleNotFound(schedule_id) from None

    def next_due(self) -> int | None:
        """When the next schedule is due, if any."""
        return min((s.due_ms for s in self.stored.values() if s.due_ms is not None), default=None)

    def fire(self) -> int:
        """Start (and cancel) what the due schedules plan; return how many sagas started."""
        now = self.clock.now_ms()
        started = 0
        for stored in self.stored.values():
            if stored.due_ms is None or stored.due_ms > now:
                continue
            ended = {r for r in stored.state.runs if self.ended(r)}
            decided = plan(
                stored.schedule, stored.state, now, ended, recheck_ms=self.config.schedule_recheck_ms
            )
            state = decided.state
            definition = self.registry.latest(stored.schedule.saga)
            for saga_id, _ in decided.start:
                self.start(stored.schedule.data, definition, saga_id)
                started += 1
            for saga_id in decided.cancel:
                self.cancel(saga_id, "a newer occurrence is due", f"schedule:{stored.schedule.id}")
            state.pending = []
            state.cancelled += state.to_cancel
            state.to_cancel = []
            stored.state, stored.due_ms = state, decided.due_ms
        return started
