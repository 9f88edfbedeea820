"""A saga for schedule tests: a report that takes a while (a durable sleep), then finishes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from saga import Saga, Schedule

REPORTS = "reports"


class Report(msgspec.Struct, frozen=True):
    name: str
    seconds: int = 150


class Done(msgspec.Struct, frozen=True):
    name: str


report: Saga[Report] = Saga("report", context=REPORTS, data=Report)
report.sleep("compute", lambda data: timedelta(seconds=data.seconds))


@report.action()
async def publish(data: Report) -> Done:
    return Done(name=data.name)


MIDNIGHT = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)  # a Monday


def every_minute(schedule_id: str = "minutely", **options: object) -> Schedule:
    data = msgspec.Raw(msgspec.json.encode(Report(name=schedule_id)))
    return Schedule(id=schedule_id, saga="report", context=REPORTS, data=data, cron="* * * * *", **options)  # type: ignore[arg-type]


late_report: Saga[Report] = Saga("late_report", context=REPORTS, data=Report)
"""A saga of the same context that only some apps have (one deployed after the schedule)."""


@late_report.action()
async def write(data: Report) -> Done:
    return Done(name=data.name)
