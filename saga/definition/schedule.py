"""Schedules: what starts sagas on a cron expression or at a later time, and the pure planner.

A :class:`Schedule` says what to start (a definition's name, its data), when (a cron
expression in an IANA zone, and/or a delayed start), on which days (skip weekends, fixed
dates, the public holidays of country or region calendars) and what to do when a run is
still going (``overlap``) or occurrences were missed while nothing was running the
scheduler (``catch_up``). Its
:class:`ScheduleState` remembers what it started. :func:`plan` decides what happens when a
schedule is due: which sagas to start (each id derived from the schedule and the
occurrence time, so starting twice is harmless), which to cancel, which occurrences to
skip, and when to look again. It is pure, so the Redis scheduler and the test runner decide
alike.

Overlap, when the previous run has not ended (ended = completed, failed, compensated or
cancelled; a dead-lettered run still counts as running):

- ``skip``: the new occurrence is skipped; never two runs at once;
- ``buffer_one``: the first such occurrence waits and starts when the run ends; later ones
  are skipped;
- ``allow_all``: start it anyway;
- ``cancel_previous``: cancel the running one(s) and start the new occurrence when they
  have ended (so there are still never two at once).

Catch-up, for occurrences that came due while no scheduler ran (found late):

- ``skip``: only an occurrence found within ``catch_up_window`` (default one minute) of its
  time runs; older ones are skipped;
- ``run_once``: the latest missed occurrence runs, once, however old (within the window if
  one is given);
- ``run_all``: every missed occurrence within the window (default one day) runs, oldest
  first (each still subject to the overlap policy).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from saga.definition.calendar import check_calendar, is_holiday
from saga.definition.cron import Cron
from saga.errors import InvalidSchedule

Overlap = Literal["skip", "buffer_one", "allow_all", "cancel_previous"]
CatchUp = Literal["skip", "run_once", "run_all"]
_DEFAULT_WINDOW_MS: Final[dict[str, int | None]] = {
    "skip": 60_000,
    "run_once": None,
    "run_all": 86_400_000,
}
_MAX_ENUMERATED: Final = 10_000
_LOOK_BACK_MS: Final = 366 * 86_400_000


class Schedule(msgspec.Struct, kw_only=True, omit_defaults=True, frozen=True):
    """When to start which saga, and what to do about overlaps, missed runs and holidays.

    Attributes:
        id: The schedule's name, unique in its context (letters, digits, ``_ . -``).
        saga: The definition's name; the newest version the worker knows is started.
        context: The definition's bounded context.
        data: The saga's start data (JSON, checked against the definition when created).
        cron: A five-field cron expression (``saga/definition/cron.py``: syntax, DST rules); empty for
            a one-off delayed start.
        start_at_ms: A delayed start: nothing runs before this time (Unix ms). Without
            ``cron`` the schedule runs once, then.
        end_at_ms: Nothing runs after this time.
        timezone: The IANA zone the cron expression and the calendar are read in.
        skip_weekends: Skip occurrences on Saturdays and Sundays (in ``timezone``).
        holidays: ISO dates (``2026-12-25``) to skip, in ``timezone``.
        holiday_calendars: Calendars whose public holidays are skipped, in ``timezone``: a
            country of the ``holidays`` package, optionally with a subdivision (``DE``,
            ``DE-BY``, ``US-NY``; see ``saga/definition/calendar.py``).
        overlap: What to do when the previous run is still going (module docstring).
        catch_up: What to do about occurrences found late (module docstring).
        catch_up_window_ms: How late an occurrence may be found and still run (``None``:
            the policy's default).

    """

    id: str
    saga: str
    context: str
    data: msgspec.Raw = msgspec.Raw(b"null")
    cron: str = ""
    start_at_ms: int | None = None
    end_at_ms: int | None = None
    timezone: str = "UTC"
    skip_weekends: bool = False
    holidays: tuple[str, ...] = ()
    holiday_calendars: tuple[str, ...] = ()
    overlap: Overlap = "skip"
    catch_up: CatchUp = "skip"
    catch_up_window_ms: int | None = None

    def __post_init__(self) -> None:
        if not self.id or len(self.id) > 128 or any(c in self.id for c in " {}@"):
            raise InvalidSchedule("an id is 1-128 characters, no spaces, braces or '@'", schedule_id=self.id)
        if not self.cron and self.start_at_ms is None:
            raise InvalidSchedule("give a cron expression, a start time, or both", schedule_id=self.id)
        if self.cron:
            Cron.parse(self.cron)
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as error:
            raise InvalidSchedule(
                f"unknown time zone {self.timezone!r} (an IANA name such as Europe/Berlin)",
                schedule_id=self.id,
            ) from error
        for day in self.holidays:
            try:
                date.fromisoformat(day)
            except ValueError as error:
                reason = f"holiday {day!r} is no YYYY-MM-DD date ({error})"
                raise InvalidSchedule(reason, schedule_id=self.id) from None
        for calendar in self.holiday_calendars:
            check_calendar(calendar)
        if self.catch_up_window_ms is not None and self.catch_up_window_ms < 0:
            raise InvalidSchedule("catch_up_window_ms must be >= 0", schedule_id=self.id)

    @property
    def window_ms(self) -> int | None:
        """How late an occurrence may be found and still run (``None``: any)."""
        if self.catch_up_window_ms is not None:
            return self.catch_up_window_ms
        return _DEFAULT_WINDOW_MS[self.catch_up]

    def next_after(self, after_ms: int) -> int | None:
        """The first occurrence strictly after ``after_ms`` (calendar applied), or ``None``."""
        zone = ZoneInfo(self.timezone)
        start = self.start_at_ms
        if not self.cron:
            return start if start is not None and start > after_ms and self._allowed(start, zone) else None
        cron = Cron.parse(self.cron)
        moment = datetime.fromtimestamp(max(after_ms, (start or 0) - 1) / 1000, tz=UTC)
        for _ in range(_MAX_ENUMERATED):
            found = cron.next_after(moment, zone)
            if found is None:
                return None
            at = int(found.timestamp() * 1000)
            if self.end_at_ms is not None and at > self.end_at_ms:
                return None
            if self._allowed(at, zone):
                return at
            moment = found
        return None

    def _allowed(self, at_ms: int, zone: ZoneInfo) -> bool:
        day = datetime.fromtimestamp(at_ms / 1000, tz=zone).date()
        if self.skip_weekends and day.isoweekday() >= 6:
            return False
        if day.isoformat() in self.holidays:
            return False
        return not any(is_holiday(calendar, day) for calendar in self.holiday_calendars)


class Broken(msgspec.Struct, kw_only=True, frozen=True):
    """Why a schedule stopped firing: the saga it names is unknown where it fired.

    Attributes:
        reason: What is wrong, and what the worker that fired it knows instead.
        at_ms: When that worker marked it (Unix ms, the timer clock's).

    """

    reason: str
    at_ms: int


class ScheduleState(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a schedule has done and is doing.

    Attributes:
        next_ms: The next occurrence (``None``: no more).
        paused: Paused schedules start nothing; occurrences while paused are skipped.
        broken: Set by a worker that does not know the schedule's saga: nothing starts
            until a worker that knows it repairs it, or an operator re-creates, resumes or
            triggers it (``saga/runtime/schedule_runner.py``).
        runs: Sagas it started that have not been seen ending.
        buffered_ms: An occurrence waiting for the running sagas to end.
        pending: Starts decided but not yet confirmed done, as (saga id, occurrence).
        to_cancel: Cancels decided but not yet confirmed sent.
        cancelled: Runs a cancel was sent to (``cancel_previous``).
        triggers: Manual triggers not yet handled (Unix ms of the request).
        started: Sagas started so far.  skipped: Occurrences skipped so far.
        last_started: The id of the last saga started.
        last_skipped_ms: The last skipped occurrence.

    """

    next_ms: int | None = None
    paused: bool = False
    broken: Broken | None = None
    runs: list[str] = msgspec.field(default_factory=list)
    buffered_ms: int | None = None
    pending: list[tuple[str, int]] = msgspec.field(default_factory=list)
    to_cancel: list[str] = msgspec.field(default_factory=list)
    cancelled: list[str] = msgspec.field(default_factory=list)
    triggers: list[int] = msgspec.field(default_factory=list)
    started: int = 0
    skipped: int = 0
    last_started: str = ""
    last_skipped_ms: int | None = None


@dataclass(slots=True)
class Plan:
    """What :func:`plan` decided."""

    state: ScheduleState
    start: list[tuple[str, int]] = field(default_factory=list)
    cancel: list[str] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    due_ms: int | None = None


def saga_id_for(schedule_id: str, occurrence_ms: int, *, manual: bool = False) -> str:
    """The id of the saga an occurrence starts: the same occurrence always gets the same id."""
    stamp = datetime.fromtimestamp(occurrence_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{schedule_id}@{stamp[:-4]}Z{'~manual' if manual else ''}"


def first_state(schedule: Schedule, now_ms: int) -> ScheduleState:
    """The state of a new schedule: its first occurrence at or after now."""
    return ScheduleState(next_ms=schedule.next_after(now_ms - 1))


_state_decoder = msgspec.json.Decoder(ScheduleState)
_json = msgspec.json.Encoder()


def plan(
    schedule: Schedule, state: ScheduleState, now_ms: int, ended: Collection[str], *, recheck_ms: int
) -> Plan:
    """Decide what a due schedule does now; ``ended`` are the ids of runs known to have ended."""
    s = _state_decoder.decode(_json.encode(state))
    s.runs = [r for r in s.runs if r not in ended]
    s.cancelled = [r for r in s.cancelled if r in s.runs]
    result = Plan(s)
    if s.paused:
        result.due_ms = now_ms + recheck_ms if (s.pending or s.to_cancel) else None
        return result
    occurrences: list[tuple[int, bool]] = []
    if s.buffered_ms is not None:
        occurrences.append((s.buffered_ms, False))
        s.buffered_ms = None
    occurrences += [(at, False) for at in _due(schedule, s, now_ms, result)]
    occurrences += [(at, True) for at in s.triggers]
    s.triggers = []
    for at, manual in occurrences:
        _occur(schedule, s, at, manual, result)
    waiting = s.buffered_ms is not None or s.pending or s.to_cancel
    candidates = [t for t in (s.next_ms, now_ms + recheck_ms if waiting else None) if t is not None]
    result.due_ms = min(candidates, default=None)
    return result


def _due(schedule: Schedule, s: ScheduleState, now_ms: int, result: Plan) -> list[int]:
    """The occurrences due now that the catch-up policy lets run; advance ``next_ms``."""
    window = schedule.window_ms
    cutoff = now_ms - window if window is not None else now_ms - _LOOK_BACK_MS
    found: list[int] = []
    at = s.next_ms
    skipped = 0
    while at is not None and at < cutoff and at <= now_ms:  # found too late: skipped
        if skipped == _MAX_ENUMERATED:  # a very long downtime: jump to the window
            at = schedule.next_after(cutoff - 1)
            break
        _skip(s, at, result)
        skipped += 1
        at = schedule.next_after(at)
    while at is not None and at <= now_ms and len(found) < _MAX_ENUMERATED:
        found.append(at)
        at = schedule.next_after(at)
    s.next_ms = at
    keep = found if schedule.catch_up == "run_all" else found[-1:]
    for skipped in found[: len(found) - len(keep)]:
        _skip(s, skipped, result)
    return keep


def _occur(schedule: Schedule, s: ScheduleState, at: int, manual: bool, result: Plan) -> None:
    """Apply the overlap policy to one occurrence."""
    running = s.runs
    if running and schedule.overlap != "allow_all":
        if schedule.overlap == "skip":
            _skip(s, at, result)
            return
        if schedule.overlap == "cancel_previous":
            targets = [r for r in running if r not in s.cancelled and r not in s.to_cancel]
            s.to_cancel += targets
            result.cancel += targets
        if s.buffered_ms is None:
            s.buffered_ms = at
        elif schedule.overlap == "cancel_previous":  # the newest occurrence wins the buffer
            _skip(s, s.buffered_ms, result)
            s.buffered_ms = at
        else:
            _skip(s, at, result)
        return
    saga_id = saga_id_for(schedule.id, at, manual=manual)
    if saga_id in s.runs:
        return
    s.runs.append(saga_id)
    s.pending.append((saga_id, at))
    s.started += 1
    s.last_started = saga_id
    result.start.append((saga_id, at))


def _skip(s: ScheduleState, at: int, result: Plan) -> None:
    s.skipped += 1
    s.last_skipped_ms = at
    result.skipped.append(at)
