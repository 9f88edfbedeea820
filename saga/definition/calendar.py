"""Holiday calendars for schedules: a country's or a region's public holidays, from ``holidays``.

A calendar is named by a country code the ``holidays`` package knows (ISO 3166-1: ``DE``,
``US``), optionally followed by ``-`` and one of that country's subdivisions (``DE-BY``:
Bavaria, ``US-NY``: New York). Its dates are the package's public holidays for each year,
computed when a schedule first looks at that year and kept: nobody refreshes a list of
dates yearly, and upgrading ``holidays`` brings in holidays created by law.

``holidays`` is imported on first use: it costs a third of a second, which only schedules
that name a calendar should pay.
"""

from __future__ import annotations

from datetime import date
from functools import lru_cache

from saga.errors import CalendarError


def check_calendar(name: str) -> None:
    """Refuse ``name`` (:class:`CalendarError`) unless it is ``COUNTRY`` or ``COUNTRY-SUBDIVISION``."""
    country, _, subdivision = name.partition("-")
    known = _supported()
    if country not in known:
        raise CalendarError(
            name, f"the holidays package has no country {country!r} (use an ISO 3166 code such as DE or US)"
        )
    if subdivision and subdivision not in known[country]:
        choices = ", ".join(known[country]) or "none"
        raise CalendarError(name, f"{country} has no subdivision {subdivision!r} (it has: {choices})")


def is_holiday(name: str, day: date) -> bool:
    """Whether ``day`` is a public holiday in the calendar ``name`` (checked with :func:`check_calendar`)."""
    return day in _dates(name, day.year)


@lru_cache(maxsize=1)
def _supported() -> dict[str, list[str]]:
    import holidays  # noqa: PLC0415 - costs a third of a second: only calendars pay it

    return holidays.list_supported_countries()


@lru_cache(maxsize=512)
def _dates(name: str, year: int) -> frozenset[date]:
    import holidays  # noqa: PLC0415 - see _supported

    country, _, subdivision = name.partition("-")
    return frozenset(holidays.country_holidays(country, subdiv=subdivision or None, years=year))
