"""Cron expressions: a small parser and a DST-safe "next occurrence" in any IANA zone.

Five fields, as in Vixie cron: minute (0-59), hour (0-23), day of month (1-31), month
(1-12 or ``jan``-``dec``), day of week (0-7 or ``sun``-``sat``; 0 and 7 are Sunday). Each
field is ``*``, a value, a range ``a-b``, a step ``*/n`` / ``a-b/n`` / ``a/n``, or a comma
list of those. ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily``
(``@midnight``) and ``@hourly`` are shorthands. Vixie's day rule: when both day fields are
restricted, a day matches if either matches; when one starts with ``*`` (``*/10`` too), a
day must match both.

Times are wall-clock times in the schedule's zone (``zoneinfo``), and daylight-saving
changes follow Vixie cron's rules:

- a time that does not exist (the hour skipped in spring) fires at the same wall time
  shifted by the gap (02:30 becomes 03:30), once -- unless the hour field is ``*``: an
  hourly job simply has no run in an hour that does not exist;
- a time that happens twice (the hour repeated in autumn) fires once, at its first
  occurrence -- unless the hour field is ``*``: an hourly job runs in both.

No dependency: ``croniter`` would do, but it needs ``pytz``-era DST handling patched around
and its rules for the cases above are not documented; this is 200 lines with tests of every
rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_ITEM = re.compile(r"^(\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(\d+))?$")
_SEARCH_YEARS = 9  # long enough for any valid expression (Feb 29 on a given weekday...)
_MINUTE = timedelta(minutes=1)


class CronError(ValueError):
    """A cron expression is invalid; the message says which field and why."""


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed cron expression (see the module docstring for the syntax)."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_star: bool
    weekdays_star: bool
    hours_star: bool

    @classmethod
    def parse(cls, text: str) -> Cron:
        """Parse ``text``; :class:`CronError` if it is not a valid expression."""
        expression = _MACROS.get(text.strip().lower(), text.strip().lower())
        fields = expression.split()
        if len(fields) != 5:
            raise CronError(
                f"cron {text!r}: expected 5 fields (minute hour day month weekday), got {len(fields)}"
            )
        minute, hour, day, month, weekday = fields
        weekdays = _field(weekday, _Range(0, 7, _DAYS, "day of week"), text)
        return cls(
            text=text.strip(),
            minutes=_field(minute, _Range(0, 59, {}, "minute"), text),
            hours=_field(hour, _Range(0, 23, {}, "hour"), text),
            days=_field(day, _Range(1, 31, {}, "day of month"), text),
            months=_field(month, _Range(1, 12, _MONTHS, "month"), text),
            weekdays=frozenset(d % 7 for d in weekdays),
            days_star=day.startswith("*"),
            weekdays_star=weekday.startswith("*"),
            hours_star=hour.startswith("*"),
        )

    def day_matches(self, day: date) -> bool:
        """Whether ``day`` is a day this expression runs on (both day fields, Vixie's rule)."""
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return in_month and in_week
        return in_month or in_week

    def next_after(self, after: datetime, zone: ZoneInfo) -> datetime | None:
        """The first run strictly after ``after`` (aware), as an aware UTC datetime.

        ``None`` if there is none within nine years (an expression like ``0 0 30 2 *``).
        """
        local = after.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
        limit = local.year + _SEARCH_YEARS
        while local.year <= limit:
            if local.month not in self.months:
                local = _first_of_next_month(local)
                continue
            if not self.day_matches(local.date()):
                local = local.replace(hour=0, minute=0) + timedelta(days=1)
                continue
            if local.hour not in self.hours:
                local = local.replace(minute=0) + timedelta(hours=1)
                continue
            if local.minute not in self.minutes:
                later = min((m for m in self.minutes if m > local.minute), default=None)
                local = (
                    local.replace(minute=later)
                    if later is not None
                    else local.replace(minute=0) + timedelta(hours=1)
                )
                continue
            for instant in self._instants(local, zone):
                if instant > after:
                    return instant
            local += _MINUTE
        return None

    def _instants(self, wall: datetime, zone: ZoneInfo) -> list[datetime]:
        """The real instants of a matching wall-clock time (none, one or two), DST rules applied."""
        first = wall.replace(tzinfo=zone, fold=0)
        second = wall.replace(tzinfo=zone, fold=1)
        exists = first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall
        if not exists:  # in the gap: shifted by it (fold=0 keeps the offset before), or skipped
            return [] if self.hours_star else [first.astimezone(UTC)]
        if first.utcoffset() != second.utcoffset() and self.hours_star:
            return [first.astimezone(UTC), second.astimezone(UTC)]
        return [first.astimezone(UTC)]


@dataclass(frozen=True, slots=True)
class _Range:
    low: int
    high: int
    names: dict[str, int]
    what: str


def _field(text: str, allowed: _Range, whole: str) -> frozenset[int]:
    low, high, what = allowed.low, allowed.high, allowed.what
    values: set[int] = set()
    for item in text.split(","):
        match = _ITEM.match(item)
        if not match:
            raise CronError(f"cron {whole!r}: {what} item {item!r} is not valid")
        span, step_text = match.groups()
        step = int(step_text) if step_text else 1
        if step < 1:
            raise CronError(f"cron {whole!r}: {what} step must be at least 1")
        if span == "*":
            start, end = low, high
        else:
            start_text, _, end_text = span.partition("-")
            start = _value(start_text, allowed, whole)
            end = _value(end_text, allowed, whole) if end_text else (high if step_text else start)
            if end < start:
                raise CronError(f"cron {whole!r}: {what} range {span!r} runs backwards")
        values.update(range(start, end + 1, step))
    return frozenset(values)


def _value(text: str, allowed: _Range, whole: str) -> int:
    low, high, what = allowed.low, allowed.high, allowed.what
    if text in allowed.names:
        return allowed.names[text]
    if not text.isdigit():
        raise CronError(f"cron {whole!r}: {what} value {text!r} is not a number or a name")
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"cron {whole!r}: {what} value {value} is outside {low}-{high}")
    return value


def _first_of_next_month(moment: datetime) -> datetime:
    if moment.month == 12:
        return datetime(moment.year + 1, 1, 1)  # noqa: DTZ001 - a naive wall-clock time by design
    return datetime(moment.year, moment.month + 1, 1)  # noqa: DTZ001 - a naive wall-clock time by design
