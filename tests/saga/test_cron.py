"""Cron expressions: syntax, day rules, ``L``/``#``, and daylight-saving changes in IANA zones."""

from __future__ import annotations

import calendar
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saga.definition.cron import Cron, CronError

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


def utc(found: datetime | None) -> str:
    assert found is not None
    assert found.tzinfo is UTC
    return found.strftime("%Y-%m-%d %H:%M UTC")


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("*/15 9-17/4 1,15 jan-mar/2 mon-fri", ["2026-01-01 09:00", "2026-01-01 09:15", "2026-01-01 09:30"]),
        ("5/20 0 * * 7", ["2026-01-04 00:05", "2026-01-04 00:25", "2026-01-04 00:45"]),
        ("@hourly", ["2026-01-01 01:00", "2026-01-01 02:00", "2026-01-01 03:00"]),
        ("@weekly", ["2026-01-04 00:00", "2026-01-11 00:00", "2026-01-18 00:00"]),
        ("@daily", ["2026-01-02 00:00", "2026-01-03 00:00", "2026-01-04 00:00"]),
        ("0 0 1 1 SUN,sat", ["2026-01-03 00:00", "2026-01-04 00:00", "2026-01-10 00:00"]),
        ("0 0 L * *", ["2026-01-31 00:00", "2026-02-28 00:00", "2026-03-31 00:00"]),
        ("0 0 LW * *", ["2026-01-30 00:00", "2026-02-27 00:00", "2026-03-31 00:00"]),
        ("0 18 * * 5L", ["2026-01-30 18:00", "2026-02-27 18:00", "2026-03-27 18:00"]),
        ("0 9 * * mon#1", ["2026-01-05 09:00", "2026-02-02 09:00", "2026-03-02 09:00"]),
        ("0 9 * * TUE#2,fri#3", ["2026-01-13 09:00", "2026-01-16 09:00", "2026-02-10 09:00"]),
    ],
)
def test_expressions_run_when_cron_would(expression: str, expected: list[str]) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert [r[:-4] for r in runs(expression, start, 3, ZoneInfo("UTC"))] == expected


@pytest.mark.parametrize(
    ("expression", "field", "message"),
    [
        ("* * * *", "", "expected 5 fields"),
        ("* * * * * *", "", "expected 5 fields"),  # no seconds field
        ("@fortnightly", "", "expected 5 fields"),
        ("60 * * * *", "minute", r"the minute field '60' is not valid \(0-59\)"),
        ("* 24 * * *", "hour", "the hour field '24' is not valid"),
        ("* * 0 * *", "day of month", r"'0' is not valid \(1-31, L or LW\)"),
        ("* * * 13 *", "month", "the month field '13'"),
        ("* * * foo *", "month", "jan-dec"),
        ("* * * * 8", "day of week", "the day of week field '8'"),
        ("* * * * mon#6", "day of week", "mon#1 for the first Monday"),
        ("5-1 * * * *", "minute", "'5-1' is not valid"),
        ("*/0 * * * *", "minute", "'[*]/0' is not valid"),
        ("1,,2 * * * *", "minute", "'1,,2' is not valid"),
        ("0 0 30 2 *", "", "no month has that day, so it never runs"),
    ],
)
def test_invalid_expressions_say_which_field_and_what_it_may_hold(
    expression: str, field: str, message: str
) -> None:
    with pytest.raises(CronError, match=message) as refused:
        Cron.parse(expression)
    assert refused.value.field == field
    assert refused.value.expression == expression


def test_both_day_fields_restricted_means_either_matches() -> None:
    # the 13th of the month, or any Friday
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


def test_a_day_that_does_not_come_within_fifty_years_has_no_next_run() -> None:
    # the 1st or 21st of a month that is also its last Monday: never
    assert Cron.parse("0 0 */20 * 1L").next_after(datetime(2026, 1, 1, tzinfo=UTC), BERLIN) is None


# -- daylight saving: Europe/Berlin, 2026-03-29 02:00 CET -> 03:00 CEST and
#    2026-10-25 03:00 CEST -> 02:00 CET ------------------------------------------------------


def test_berlin_spring_forward_a_fixed_time_in_the_gap_runs_once_when_the_gap_ends() -> None:
    cron = Cron.parse("30 2 * * *")
    assert utc(cron.next_after(datetime(2026, 3, 28, 12, tzinfo=UTC), BERLIN)) == "2026-03-29 01:00 UTC"
    assert runs("30 2 * * *", datetime(2026, 3, 28, 12, tzinfo=UTC), 3, BERLIN) == [
        "2026-03-29 03:00 CEST",
        "2026-03-30 02:30 CEST",
        "2026-03-31 02:30 CEST",
    ]
    # two fixed times in the gap run once between them, then the next one after the gap
    assert runs("0,30 2,3 * * *", datetime(2026, 3, 28, 12, tzinfo=UTC), 3, BERLIN) == [
        "2026-03-29 03:00 CEST",
        "2026-03-29 03:30 CEST",
        "2026-03-30 02:00 CEST",
    ]


def test_berlin_fall_back_a_fixed_time_in_the_repeated_hour_runs_once_the_first_time() -> None:
    cron = Cron.parse("30 2 * * *")
    assert utc(cron.next_after(datetime(2026, 10, 24, 12, tzinfo=UTC), BERLIN)) == "2026-10-25 00:30 UTC"
    # asked between the two copies of 02:30 (02:10 CET is after 02:30 CEST): not again
    between = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)
    assert utc(cron.next_after(between, BERLIN)) == "2026-10-26 01:30 UTC"
    assert runs("30 2 * * *", datetime(2026, 10, 24, 12, tzinfo=UTC), 3, BERLIN) == [
        "2026-10-25 02:30 CEST",
        "2026-10-26 02:30 CET",
        "2026-10-27 02:30 CET",
    ]
    assert runs("0,30 2,3 * * *", datetime(2026, 10, 24, 12, tzinfo=UTC), 4, BERLIN) == [
        "2026-10-25 02:00 CEST",
        "2026-10-25 02:30 CEST",
        "2026-10-25 03:00 CET",
        "2026-10-25 03:30 CET",
    ]


def test_berlin_an_expression_with_a_star_runs_by_the_clock_through_both_changes() -> None:
    # no run at wall times that do not exist
    assert runs("30 * * * *", datetime(2026, 3, 28, 23, tzinfo=UTC), 3, BERLIN) == [
        "2026-03-29 00:30 CET",
        "2026-03-29 01:30 CET",
        "2026-03-29 03:30 CEST",
    ]
    # both copies of a wall time that happens twice
    assert runs("30 * * * *", datetime(2026, 10, 24, 23, tzinfo=UTC), 4, BERLIN) == [
        "2026-10-25 01:30 CEST",
        "2026-10-25 02:30 CEST",
        "2026-10-25 02:30 CET",
        "2026-10-25 03:30 CET",
    ]
    # a star in the minute field counts too: every 30 minutes of hour 2 of each copy
    assert runs("*/30 2 * * *", datetime(2026, 10, 24, 23, tzinfo=UTC), 4, BERLIN) == [
        "2026-10-25 02:00 CEST",
        "2026-10-25 02:30 CEST",
        "2026-10-25 02:00 CET",
        "2026-10-25 02:30 CET",
    ]
    assert runs("*/30 2 * * *", datetime(2026, 3, 28, 23, tzinfo=UTC), 1, BERLIN) == ["2026-03-30 02:00 CEST"]


def test_new_york_changes_follow_the_same_rules() -> None:
    # 2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT -> 01:00 EST
    assert runs("30 2 * * *", datetime(2026, 3, 7, 12, tzinfo=UTC), 2) == [
        "2026-03-08 03:00 EDT",
        "2026-03-09 02:30 EDT",
    ]
    assert runs("30 1 * * *", datetime(2026, 10, 31, 12, tzinfo=UTC), 2) == [
        "2026-11-01 01:30 EDT",
        "2026-11-02 01:30 EST",
    ]


def test_a_half_hour_shift_is_handled_too() -> None:
    # Lord Howe Island moves its clocks by 30 minutes: 2026-10-04 02:00 -> 02:30
    assert runs("15 2 * * *", datetime(2026, 10, 3, 0, tzinfo=UTC), 2, LORD_HOWE) == [
        "2026-10-04 02:30 +11",
        "2026-10-05 02:15 +11",
    ]


def test_weekday_names_and_last_weekdays_are_read_in_the_zone_not_in_utc() -> None:
    # 09:00 Monday in Berlin is 08:00 UTC (CET): it must not slip to another weekday
    assert runs("0 9 * * mon", datetime(2026, 3, 1, tzinfo=UTC), 2, BERLIN) == [
        "2026-03-02 09:00 CET",
        "2026-03-09 09:00 CET",
    ]
    # 00:30 on the last Friday in Tokyo is still Thursday in UTC
    tokyo = Cron.parse("30 0 * * 5L").next_after(datetime(2026, 1, 1, tzinfo=UTC), ZoneInfo("Asia/Tokyo"))
    assert utc(tokyo) == "2026-01-29 15:30 UTC"


MINUTES: dict[str, set[int]] = {
    "*": set(range(60)),
    "*/7": set(range(0, 60, 7)),
    "0": {0},
    "30": {30},
    "15,45": {15, 45},
}
HOURS: dict[str, set[int]] = {
    "*": set(range(24)),
    "1": {1},
    "2": {2},
    "*/3": set(range(0, 24, 3)),
    "0-3": {0, 1, 2, 3},
}


@settings(max_examples=200, deadline=None)
@given(
    minute=st.sampled_from(sorted(MINUTES)),
    hour=st.sampled_from(sorted(HOURS)),
    zone=st.sampled_from(["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "UTC"]),
    start=st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2027, 12, 31)),  # noqa: DTZ001
)
def test_runs_increase_match_the_fields_and_follow_the_dst_rules(
    minute: str, hour: str, zone: str, start: datetime
) -> None:
    cron, tz = Cron.parse(f"{minute} {hour} * * *"), ZoneInfo(zone)
    fixed = not minute.startswith("*") and not hour.startswith("*")
    moment = start.replace(tzinfo=UTC)
    previous = None
    for _ in range(30):
        found = cron.next_after(moment, tz)
        assert found is not None
        assert found > moment
        if previous is not None:
            assert found - previous >= timedelta(minutes=1)
        assert follows_the_rules(MINUTES[minute], HOURS[hour], fixed, found, tz)
        previous = moment = found


def follows_the_rules(minutes: set[int], hours: set[int], fixed: bool, found: datetime, tz: ZoneInfo) -> bool:
    """A matching wall time (a fixed-time job: its first copy), or a fixed time skipped by a gap."""
    local = found.astimezone(tz)
    if local.minute in minutes and local.hour in hours:
        repeated = (found - timedelta(hours=1)).astimezone(tz).replace(tzinfo=None) == local.replace(
            tzinfo=None
        )
        half = (found - timedelta(minutes=30)).astimezone(tz).replace(tzinfo=None) == local.replace(
            tzinfo=None
        )
        return not (fixed and (repeated or half))
    before = (found - timedelta(minutes=1)).astimezone(tz)
    gap = local.utcoffset() - before.utcoffset()  # type: ignore[operator]
    if not fixed or gap <= timedelta(0):
        return False
    wall = local.replace(tzinfo=None)
    skipped = (wall - timedelta(minutes=m) for m in range(1, int(gap.total_seconds()) // 60 + 1))
    return any(w.minute in minutes and w.hour in hours for w in skipped)


def last_day(d: date) -> bool:
    return d.day == calendar.monthrange(d.year, d.month)[1]


DAYS: dict[str, Callable[[date], bool]] = {
    "*": lambda d: True,
    "1,15": lambda d: d.day in {1, 15},
    "*/3": lambda d: d.day % 3 == 1,
    "31": lambda d: d.day == 31,
    "L": last_day,
}
WEEKDAYS: dict[str, Callable[[date], bool]] = {
    "*": lambda d: True,
    "mon-fri": lambda d: d.isoweekday() <= 5,
    "0": lambda d: d.isoweekday() == 7,
    "sat": lambda d: d.isoweekday() == 6,
    "5L": lambda d: d.isoweekday() == 5 and d.day + 7 > calendar.monthrange(d.year, d.month)[1],
    "mon#1": lambda d: d.isoweekday() == 1 and d.day <= 7,
}
MINUTES_WIDE = {"*/10": set(range(0, 60, 10)), "5,35,50": {5, 35, 50}, "7-9": {7, 8, 9}, "0": {0}}
HOURS_WIDE = {"*": set(range(24)), "*/5": set(range(0, 24, 5)), "3,17": {3, 17}, "22-23": {22, 23}}


@settings(max_examples=100, deadline=None)
@given(
    minute=st.sampled_from(sorted(MINUTES_WIDE)),
    hour=st.sampled_from(sorted(HOURS_WIDE)),
    day=st.sampled_from(sorted(DAYS)),
    weekday=st.sampled_from(sorted(WEEKDAYS)),
    start=st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2027, 12, 31)),  # noqa: DTZ001
)
def test_no_matching_minute_is_skipped_compared_with_brute_force(
    minute: str, hour: str, day: str, weekday: str, start: datetime
) -> None:
    cron = Cron.parse(f"{minute} {hour} {day} * {weekday}")
    either = not day.startswith("*") and not weekday.startswith("*")

    def day_matches(d: date) -> bool:
        in_month, in_week = DAYS[day](d), WEEKDAYS[weekday](d)
        return (in_month or in_week) if either else (in_month and in_week)

    moment = start.replace(tzinfo=UTC, second=0, microsecond=0)
    expected: list[datetime] = []
    for offset in range(100):  # every minute of every matching day, in order
        day_ = moment.date() + timedelta(days=offset)
        if day_matches(day_):
            midnight = datetime(day_.year, day_.month, day_.day, tzinfo=UTC)
            expected += [
                at
                for h in sorted(HOURS_WIDE[hour])
                for m in sorted(MINUTES_WIDE[minute])
                if (at := midnight + timedelta(hours=h, minutes=m)) > moment
            ]
    expected = expected[:5]
    found, at = [], moment
    for _ in expected:
        at = cron.next_after(at, ZoneInfo("UTC"))  # type: ignore[assignment]
        found.append(at)
    assert found == expected
