"""The pure schedule planner: calendars, delayed starts, overlap and catch-up policies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from saga import Schedule
from saga.definition.calendar import CalendarError
from saga.definition.schedule import ScheduleState, first_state, plan, saga_id_for

MINUTE = 60_000
T0 = int(datetime(2026, 3, 2, 0, 0, tzinfo=UTC).timestamp() * 1000)  # Monday 00:00 UTC


def schedule(**options: object) -> Schedule:
    base: dict[str, object] = {"id": "s", "saga": "report", "context": "reports", "cron": "* * * * *"}
    return Schedule(**{**base, **options})  # type: ignore[arg-type]


def at(day: int, hour: int = 0, minute: int = 0, zone: str = "UTC") -> int:
    from zoneinfo import ZoneInfo

    return int(datetime(2026, 3, day, hour, minute, tzinfo=ZoneInfo(zone)).timestamp() * 1000)


def test_the_first_occurrence_is_at_or_after_now() -> None:
    assert first_state(schedule(), T0).next_ms == T0
    assert first_state(schedule(), T0 + 1).next_ms == T0 + MINUTE


def test_a_delayed_start_without_cron_runs_once_then() -> None:
    once = schedule(cron="", start_at_ms=T0 + 5 * MINUTE)
    state = first_state(once, T0)
    assert state.next_ms == T0 + 5 * MINUTE
    decided = plan(once, state, T0 + 5 * MINUTE, set(), recheck_ms=1000)
    assert [s for s, _ in decided.start] == [saga_id_for("s", T0 + 5 * MINUTE)]
    assert decided.state.next_ms is None
    assert decided.due_ms == T0 + 5 * MINUTE + 1000  # back to confirm the pending start


def test_a_delayed_start_with_cron_begins_at_the_first_occurrence_after_it() -> None:
    later = schedule(cron="0 * * * *", start_at_ms=T0 + 90 * MINUTE)
    assert first_state(later, T0).next_ms == T0 + 120 * MINUTE


def test_an_end_time_stops_the_schedule() -> None:
    ending = schedule(cron="0 * * * *", end_at_ms=T0 + 60 * MINUTE)
    assert ending.next_after(T0) == T0 + 60 * MINUTE
    assert ending.next_after(T0 + 60 * MINUTE) is None


def test_weekends_and_holidays_are_skipped_in_the_schedule_zone() -> None:
    weekdays = schedule(
        cron="0 9 * * *", timezone="Europe/Berlin", skip_weekends=True, holidays=("2026-03-04",)
    )
    found, moment = [], at(1)
    for _ in range(5):
        moment = weekdays.next_after(moment)  # type: ignore[assignment]
        found.append(datetime.fromtimestamp(moment / 1000, tz=UTC).strftime("%a %d"))
    assert found == ["Mon 02", "Tue 03", "Thu 05", "Fri 06", "Mon 09"]


def test_a_late_night_utc_run_counts_on_its_local_date() -> None:
    # 23:30 UTC on Friday is already Saturday in Tokyo: skipped as a weekend day there
    tokyo = schedule(cron="30 8 * * *", timezone="Asia/Tokyo", skip_weekends=True)
    saturday_morning_tokyo = at(6, 23, 30)  # Fri 23:30 UTC = Sat 08:30 JST
    nxt = tokyo.next_after(saturday_morning_tokyo - 1)
    assert nxt == at(8, 23, 30)  # Mon 08:30 JST = Sun 23:30 UTC


def local_runs(spec: Schedule, start: datetime, count: int) -> list[str]:
    """The next ``count`` runs after ``start``, as dates in the schedule's zone."""
    from zoneinfo import ZoneInfo

    found, moment = [], int(start.timestamp() * 1000)
    for _ in range(count):
        moment = spec.next_after(moment)  # type: ignore[assignment]
        found.append(datetime.fromtimestamp(moment / 1000, tz=ZoneInfo(spec.timezone)).strftime("%m-%d"))
    return found


def test_a_holiday_calendar_skips_the_public_holidays_of_its_region() -> None:
    bavaria = schedule(cron="0 9 * * *", timezone="Europe/Berlin", holiday_calendars=("DE-BY",))
    berlin = schedule(cron="0 9 * * *", timezone="Europe/Berlin", holiday_calendars=("DE-BE",))
    new_year = datetime(2026, 1, 4, 12, tzinfo=UTC)
    # Epiphany (6 January) is a public holiday in Bavaria, not in Berlin
    assert local_runs(bavaria, new_year, 3) == ["01-05", "01-07", "01-08"]
    assert local_runs(berlin, new_year, 3) == ["01-05", "01-06", "01-07"]
    # the next year needs no new list of dates
    assert local_runs(bavaria, datetime(2027, 1, 4, 12, tzinfo=UTC), 2) == ["01-05", "01-07"]
    # movable feasts: Good Friday and Easter Monday 2026 are 3 and 6 April everywhere in Germany
    assert local_runs(berlin, datetime(2026, 4, 1, 12, tzinfo=UTC), 3) == ["04-02", "04-04", "04-05"]


def test_calendars_fixed_dates_and_weekends_combine() -> None:
    # 4 July 2026 is a Saturday: New York observes Independence Day on Friday 3 July
    new_york = schedule(
        cron="0 9 * * *",
        timezone="America/New_York",
        skip_weekends=True,
        holidays=("2026-07-06",),
        holiday_calendars=("US-NY",),
    )
    assert local_runs(new_york, datetime(2026, 7, 1, 12, tzinfo=UTC), 3) == ["07-01", "07-02", "07-07"]
    # a country's calendar without a region: its nationwide holidays (German Unity Day)
    germany = schedule(cron="0 9 * * *", timezone="Europe/Berlin", holiday_calendars=("DE",))
    assert local_runs(germany, datetime(2026, 10, 1, 12, tzinfo=UTC), 2) == ["10-02", "10-04"]


@pytest.mark.parametrize(
    ("calendar", "message"),
    [
        ("XX", "holiday calendar 'XX': the holidays package has no country 'XX' .*such as DE or US"),
        ("de-by", "no country 'de'"),
        ("DE-XX", r"DE has no subdivision 'XX' \(it has: BB, BE, BW, BY, "),
        ("", "no country ''"),
    ],
)
def test_an_unknown_holiday_calendar_is_refused_when_the_schedule_is_made(
    calendar: str, message: str
) -> None:
    with pytest.raises(CalendarError, match=message) as refused:
        schedule(holiday_calendars=("DE-BY", calendar))
    assert refused.value.calendar == calendar
    with pytest.raises(msgspec.ValidationError, match=message):  # decoding checks it too
        msgspec.convert(
            {"id": "s", "saga": "r", "context": "c", "cron": "@daily", "holiday_calendars": [calendar]},
            Schedule,
        )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"cron": "nope"}, "expected 5 fields"),
        ({"timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "", "start_at_ms": None}, "give a cron expression, a start time, or both"),
        ({"holidays": ("25/12/2026",)}, "Invalid isoformat"),
        ({"id": "has space"}, "no spaces"),
    ],
)
def test_invalid_schedules_are_refused(bad: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        schedule(**bad)


def running(state: ScheduleState, *ids: str) -> ScheduleState:
    return msgspec.structs.replace(state, runs=list(ids), pending=[])


@pytest.mark.parametrize(
    ("overlap", "started", "buffered", "cancelled", "skipped"),
    [
        ("skip", 0, None, [], 1),
        ("buffer_one", 0, T0, [], 0),
        ("allow_all", 1, None, [], 0),
        ("cancel_previous", 0, T0, ["old"], 0),
    ],
)
def test_overlap_policies_when_a_run_is_still_going(
    overlap: str, started: int, buffered: int | None, cancelled: list[str], skipped: int
) -> None:
    spec = schedule(overlap=overlap)
    decided = plan(spec, running(first_state(spec, T0), "old"), T0, set(), recheck_ms=1000)
    assert len(decided.start) == started
    assert decided.state.buffered_ms == buffered
    assert decided.cancel == cancelled
    assert len(decided.skipped) == skipped
    assert decided.state.next_ms == T0 + MINUTE


def test_buffer_one_keeps_only_the_first_waiting_occurrence_and_starts_it_when_the_run_ends() -> None:
    spec = schedule(overlap="buffer_one")
    state = running(first_state(spec, T0), "old")
    state = plan(spec, state, T0, set(), recheck_ms=1000).state
    second = plan(spec, state, T0 + MINUTE, set(), recheck_ms=1000)
    assert second.state.buffered_ms == T0
    assert second.skipped == [T0 + MINUTE]
    ended = plan(spec, second.state, T0 + MINUTE + 5_000, {"old"}, recheck_ms=1000)
    assert ended.start == [(saga_id_for("s", T0), T0)]
    assert ended.state.buffered_ms is None


def test_cancel_previous_cancels_once_and_starts_the_newest_after_the_run_ended() -> None:
    spec = schedule(overlap="cancel_previous")
    state = running(first_state(spec, T0), "old")
    first = plan(spec, state, T0, set(), recheck_ms=1000)
    assert first.cancel == ["old"]
    state = msgspec.structs.replace(first.state, cancelled=["old"], to_cancel=[])
    again = plan(spec, state, T0 + MINUTE, set(), recheck_ms=1000)
    assert again.cancel == []  # not sent twice
    assert again.state.buffered_ms == T0 + MINUTE  # the newest occurrence wins the buffer
    assert again.skipped == [T0]
    done = plan(spec, again.state, T0 + MINUTE + 1, {"old"}, recheck_ms=1000)
    assert done.start == [(saga_id_for("s", T0 + MINUTE), T0 + MINUTE)]


@pytest.mark.parametrize(
    ("catch_up", "window", "expected_starts", "expected_skipped"),
    [
        ("skip", None, [9], 9),  # the newest is 30 s late: on time (a minute's grace)
        ("skip", timedelta(seconds=10), [], 10),  # all were found too late
        ("run_once", None, [9], 9),
        ("run_all", None, list(range(10)), 0),
        ("run_all", timedelta(minutes=3, seconds=30), [6, 7, 8, 9], 6),
        ("skip", timedelta(minutes=3), [9], 9),
    ],
)
def test_catch_up_policies_after_ten_missed_minutes(
    catch_up: str, window: timedelta | None, expected_starts: list[int], expected_skipped: int
) -> None:
    window_ms = None if window is None else int(window.total_seconds() * 1000)
    spec = schedule(catch_up=catch_up, catch_up_window_ms=window_ms, overlap="allow_all")
    now = T0 + 9 * MINUTE + 30_000  # occurrences 0..9 are due; the newest is 30 s late
    decided = plan(spec, first_state(spec, T0), now, set(), recheck_ms=1000)
    assert [(at - T0) // MINUTE for _, at in decided.start] == expected_starts
    assert len(decided.skipped) == expected_skipped
    assert decided.state.next_ms == T0 + 10 * MINUTE


def test_an_on_time_occurrence_runs_under_every_catch_up_policy() -> None:
    for catch_up in ("skip", "run_once", "run_all"):
        spec = schedule(catch_up=catch_up)
        decided = plan(spec, first_state(spec, T0), T0 + 40, set(), recheck_ms=1000)
        assert [at for _, at in decided.start] == [T0]


def test_a_manual_trigger_runs_now_with_its_own_id_and_the_overlap_policy() -> None:
    spec = schedule(cron="0 0 1 1 *")
    state = msgspec.structs.replace(first_state(spec, T0), triggers=[T0 + 5])
    decided = plan(spec, state, T0 + 10, set(), recheck_ms=1000)
    assert decided.start == [(saga_id_for("s", T0 + 5, manual=True), T0 + 5)]
    assert decided.start[0][0].endswith("~manual")
    blocked = plan(spec, running(msgspec.structs.replace(state), "old"), T0 + 10, set(), recheck_ms=1000)
    assert blocked.start == []


def test_a_paused_schedule_starts_nothing() -> None:
    spec = schedule()
    state = msgspec.structs.replace(first_state(spec, T0), paused=True)
    decided = plan(spec, state, T0 + 10 * MINUTE, set(), recheck_ms=1000)
    assert decided.start == []
    assert decided.due_ms is None


def test_runs_that_ended_are_forgotten() -> None:
    spec = schedule()
    decided = plan(spec, running(first_state(spec, T0), "a", "b"), T0, {"a", "b"}, recheck_ms=1000)
    assert decided.state.runs == [saga_id_for("s", T0)]


def test_saga_ids_are_derived_from_the_occurrence() -> None:
    assert saga_id_for("nightly", T0) == "nightly@2026-03-02T00:00:00.000Z"
    assert saga_id_for("nightly", T0 + 1) != saga_id_for("nightly", T0)
