"""Cron expressions: syntax, day rules, and daylight-saving changes in IANA zones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga import CronError
from saga._cron import Cron

NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")  # a 30-minute daylight-saving shift


def runs(expression: str, start: datetime, count: int, zone: ZoneInfo = NEW_YORK) -> list[str]:
    cron, moment, out = Cron.parse(expression), start, []
    for _ in range(count):
        found = cron.next_after(moment, zone)
        assert found is not None
        assert found > moment
        out.append(found.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z"))
        moment = found
    return out


@pytest.mark.parametrize(
    ("expression", "minutes", "hours", "days", "months", "weekdays"),
    [
        ("* * * * *", set(range(60)), set(range(24)), set(range(1, 32)), set(range(1, 13)), set(range(7))),
        (
            "*/15 9-17/4 1,15 jan-mar/2 mon-fri",
            {0, 15, 30, 45},
            {9, 13, 17},
            {1, 15},
            {1, 3},
            {1, 2, 3, 4, 5},
        ),
        ("5/20 0 * * 7", {5, 25, 45}, {0}, set(range(1, 32)), set(range(1, 13)), {0}),
        ("@hourly", {0}, set(range(24)), set(range(1, 32)), set(range(1, 13)), set(range(7))),
        ("@weekly", {0}, {0}, set(range(1, 32)), set(range(1, 13)), {0}),
        ("0 0 1 1 SUN,sat", {0}, {0}, {1}, {1}, {0, 6}),
    ],
)
def test_fields_parse(  # noqa: PLR0917 - one parameter per field
    expression: str, minutes: set[int], hours: set[int], days: set[int], months: set[int], weekdays: set[int]
) -> None:
    cron = Cron.parse(expression)
    assert (set(cron.minutes), set(cron.hours), set(cron.days), set(cron.months), set(cron.weekdays)) == (
        minutes,
        hours,
        days,
        months,
        weekdays,
    )


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * * *", "expected 5 fields"),
        ("60 * * * *", "minute value 60 is outside 0-59"),
        ("* 24 * * *", "hour value 24 is outside 0-23"),
        ("* * 0 * *", "day of month value 0 is outside 1-31"),
        ("* * * 13 *", "month value 13"),
        ("* * * * 8", "day of week value 8"),
        ("* * * foo *", "month value 'foo' is not a number or a name"),
        ("5-1 * * * *", "runs backwards"),
        ("*/0 * * * *", "step must be at least 1"),
        ("1,,2 * * * *", "item '' is not valid"),
        ("@fortnightly", "expected 5 fields"),
    ],
)
def test_invalid_expressions_say_what_is_wrong(expression: str, message: str) -> None:
    with pytest.raises(CronError, match=message):
        Cron.parse(expression)


def test_both_day_fields_restricted_means_either_matches() -> None:
    # Vixie cron: the 13th of the month, or any Friday
    found = runs("0 12 13 * 5", datetime(2026, 2, 1, tzinfo=UTC), 4, ZoneInfo("UTC"))
    assert found == [
        "2026-02-06 12:00 UTC",
        "2026-02-13 12:00 UTC",
        "2026-02-20 12:00 UTC",
        "2026-02-27 12:00 UTC",
    ]
    # a star in one day field leaves only the other
    assert runs("0 12 */10 * *", datetime(2026, 2, 1, tzinfo=UTC), 3, ZoneInfo("UTC")) == [
        "2026-02-01 12:00 UTC",
        "2026-02-11 12:00 UTC",
        "2026-02-21 12:00 UTC",
    ]


def test_a_leap_day_schedule_finds_the_next_leap_year() -> None:
    assert runs("0 0 29 2 *", datetime(2026, 1, 1, tzinfo=UTC), 2, ZoneInfo("UTC")) == [
        "2028-02-29 00:00 UTC",
        "2032-02-29 00:00 UTC",
    ]


def test_an_impossible_date_has_no_next_run() -> None:
    assert Cron.parse("0 0 30 2 *").next_after(datetime(2026, 1, 1, tzinfo=UTC), NEW_YORK) is None


def test_spring_forward_a_fixed_time_in_the_gap_runs_once_shifted_by_the_gap() -> None:
    # 2026-03-08 02:00 EST -> 03:00 EDT: 02:30 does not exist that day
    assert runs("30 2 * * *", datetime(2026, 3, 7, 12, tzinfo=UTC), 3) == [
        "2026-03-08 03:30 EDT",
        "2026-03-09 02:30 EDT",
        "2026-03-10 02:30 EDT",
    ]


def test_spring_forward_an_hourly_job_has_no_run_in_the_missing_hour() -> None:
    assert runs("30 * * * *", datetime(2026, 3, 8, 5, tzinfo=UTC), 4) == [
        "2026-03-08 00:30 EST",
        "2026-03-08 01:30 EST",
        "2026-03-08 03:30 EDT",
        "2026-03-08 04:30 EDT",
    ]


def test_fall_back_a_fixed_time_in_the_repeated_hour_runs_once() -> None:
    # 2026-11-01 02:00 EDT -> 01:00 EST: 01:30 happens twice
    assert runs("30 1 * * *", datetime(2026, 10, 31, 12, tzinfo=UTC), 3) == [
        "2026-11-01 01:30 EDT",
        "2026-11-02 01:30 EST",
        "2026-11-03 01:30 EST",
    ]


def test_fall_back_an_hourly_job_runs_in_both_copies_of_the_repeated_hour() -> None:
    assert runs("30 * * * *", datetime(2026, 11, 1, 4, tzinfo=UTC), 4) == [
        "2026-11-01 00:30 EDT",
        "2026-11-01 01:30 EDT",
        "2026-11-01 01:30 EST",
        "2026-11-01 02:30 EST",
    ]


def test_a_half_hour_shift_is_handled_too() -> None:
    # Lord Howe Island moves its clocks by 30 minutes: 2026-10-04 02:00 -> 02:30
    assert runs("15 2 * * *", datetime(2026, 10, 3, 0, tzinfo=UTC), 2, LORD_HOWE) == [
        "2026-10-04 02:45 +11",
        "2026-10-05 02:15 +11",
    ]


def test_weekday_names_are_read_in_the_zone_not_in_utc() -> None:
    # 09:00 Monday in Berlin is 08:00 UTC (CET): it must not slip to another weekday
    found = runs("0 9 * * mon", datetime(2026, 3, 1, tzinfo=UTC), 2, BERLIN)
    assert found == ["2026-03-02 09:00 CET", "2026-03-09 09:00 CET"]


@settings(max_examples=200, deadline=None)
@given(
    minute=st.sampled_from(["*", "*/7", "0", "30", "15,45"]),
    hour=st.sampled_from(["*", "1", "2", "*/3", "0-3"]),
    zone=st.sampled_from(["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "UTC"]),
    start=st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2027, 12, 31)),  # noqa: DTZ001
)
def test_runs_are_strictly_increasing_match_the_fields_and_are_never_closer_than_a_minute(
    minute: str, hour: str, zone: str, start: datetime
) -> None:
    cron, tz = Cron.parse(f"{minute} {hour} * * *"), ZoneInfo(zone)
    moment = start.replace(tzinfo=UTC)
    previous = None
    for _ in range(30):
        found = cron.next_after(moment, tz)
        assert found is not None
        assert found > moment
        if previous is not None:
            assert found - previous >= timedelta(minutes=1)
        assert matches(cron, found, tz)
        previous = moment = found


def matches(cron: Cron, found: datetime, tz: ZoneInfo) -> bool:
    """The run is a wall time matching the fields, or one in a DST gap shifted by the gap."""
    local = found.astimezone(tz).replace(tzinfo=None)
    for wall in (local, local - timedelta(minutes=30), local - timedelta(hours=1)):
        fits = wall.minute in cron.minutes and wall.hour in cron.hours
        exists = wall.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None) == wall
        if fits and (wall == local or (not exists and wall.replace(tzinfo=tz).astimezone(UTC) == found)):
            return True
    return False


@settings(max_examples=100, deadline=None)
@given(
    minute=st.sampled_from(["*/10", "5,35,50", "7-9", "*/13", "0"]),
    hour=st.sampled_from(["*", "*/5", "3,17", "22-23"]),
    day=st.sampled_from(["*", "1,15", "*/3", "31"]),
    weekday=st.sampled_from(["*", "mon-fri", "0", "sat"]),
    start=st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2027, 12, 31)),  # noqa: DTZ001
)
def test_no_matching_minute_is_skipped_compared_with_brute_force(
    minute: str, hour: str, day: str, weekday: str, start: datetime
) -> None:
    cron = Cron.parse(f"{minute} {hour} {day} * {weekday}")
    moment = start.replace(tzinfo=UTC, second=0, microsecond=0)
    expected, probe = [], moment
    while len(expected) < 5 and probe < moment + timedelta(days=70):
        probe += timedelta(minutes=1)
        if probe.minute in cron.minutes and probe.hour in cron.hours and cron.day_matches(probe.date()):
            expected.append(probe)
    found, at = [], moment
    for _ in expected:
        at = cron.next_after(at, ZoneInfo("UTC"))  # type: ignore[assignment]
        found.append(at)
    assert found == expected
