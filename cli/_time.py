"""``saga signal`` and ``saga schedule …``: thin shells over ``SagaClient`` and ``ScheduleClient``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec
import typer

from redsaga.cli._common import (
    Json,
    RedisUrl,
    UsageProblem,
    app_option,
    emit_json,
    emit_line,
    emit_table,
    reporting_errors,
    with_redis,
)
from redsaga.cli._format import when
from redsaga.cli._load import load_app
from saga import Registry, SagaClient, Schedule, ScheduleClient, Versions
from saga.definition.schedule import ScheduleState
from saga.runtime.schedule_runner import BROKEN_RECHECK_MS, ScheduleInfo

AppRef = Annotated[
    str | None, app_option("module:attribute of the App, to check data against its definitions.")
]
ContextOption = Annotated[str, typer.Option("--context", "-c", help="The bounded context of the schedules.")]


def _registry(app_ref: str | None) -> Registry:
    if app_ref is None:
        return Registry([])
    return load_app(app_ref).registry


def _json_option(text: str) -> Any:
    """The parser of JSON options: the decoded value, or a usage error."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as error:
        raise typer.BadParameter(f"not JSON: {error}") from None


def signal(
    token: Annotated[str, typer.Argument(help="The resume token the waiting step gave out.")],
    data: Annotated[
        Any, typer.Option("--data", parser=_json_option, metavar="JSON", help="The signal's data as JSON.")
    ] = "null",
    by: Annotated[str, typer.Option(help="Who signals (recorded in the saga's history).")] = "cli",
    app_ref: AppRef = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Deliver a resume token: the waiting saga resumes once with DATA.

    The token is checked before anything is written (a forged or altered token fails).
    The data is checked against the step's output type here (with --app, by its code; else
    by the type's schema its workers registered); the worker checks it again either way. A
    wait that has ended (resumed already, timed out, its saga ended) is an error (exit 1):
    nothing is sent. So is a human task's wait: answer it with `saga tasks complete`, which
    asks the authorizer.
    """
    registry = _registry(app_ref)

    entry = with_redis(
        redis_url, lambda redis: SagaClient(redis, registry, source=by).signal(token, data, by=by)
    )
    if json_output:
        emit_json({"delivered": entry})
    else:
        emit_line(f"signal delivered ({entry})")


schedule_app = typer.Typer(help="Schedules: start sagas on a cron expression or at a later time.")


def _with_client(redis_url: str | None, context: str, job: Any, registry: Registry | None = None) -> Any:
    return with_redis(redis_url, lambda redis: job(ScheduleClient(redis, context, registry=registry)))


def _as_json(info: ScheduleInfo) -> dict[str, Any]:
    """One schedule as ``--json`` prints it: every field, defaults too, so the shape is fixed."""
    return {
        "schedule": msgspec.structs.asdict(info.schedule),
        "state": msgspec.structs.asdict(info.state),
        "revision": info.revision,
        "due_ms": info.due_ms,
    }


def _state(state: ScheduleState) -> str:
    flags = [flag for flag, on in (("paused", state.paused), ("broken", state.broken is not None)) if on]
    return ", ".join(flags) or "active"


def _show(infos: list[ScheduleInfo], json_output: bool) -> None:
    if json_output:
        emit_json([_as_json(i) for i in infos])
        return
    rows = [
        [
            i.schedule.id,
            i.schedule.saga,
            i.schedule.context,
            i.schedule.cron or "once",
            i.schedule.timezone,
            i.schedule.overlap,
            _state(i.state),
            when(i.state.next_ms),
            i.state.started,
            i.state.skipped,
            len(i.state.runs),
        ]
        for i in infos
    ]
    headers = [
        "id",
        "saga",
        "context",
        "cron",
        "zone",
        "overlap",
        "state",
        "next",
        "started",
        "skipped",
        "running",
    ]
    emit_table(headers, rows, colours={6: lambda cell: "red" if "broken" in cell else None})
    broken = [(i.schedule.id, i.state.broken) for i in infos if i.state.broken is not None]
    for schedule_id, mark in broken:
        emit_line(f"{schedule_id}: broken since {when(mark.at_ms)}: {mark.reason}")
    if broken:
        emit_line(
            "A broken schedule starts nothing. Name a saga that exists (schedule create --replace), "
            f"or run a worker that knows it (it repairs the schedule within {BROKEN_RECHECK_MS // 1000} s); "
            "schedule resume tries again now."
        )


@schedule_app.command("list")
@reporting_errors
def list_schedules(
    context: Annotated[
        str | None,
        typer.Option(
            "--context", "-c", help="Only this context's schedules (default: every registered context)."
        ),
    ] = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """List schedules: context, policy, state (active, paused, broken), next run, counts.

    A broken schedule names a saga the worker that fired it does not know; each is listed
    with why under the table. --json prints a list of {schedule, state, revision, due_ms}
    with every field present (docs/time.md).
    """

    async def job(redis: Any) -> list[ScheduleInfo]:
        contexts = [context] if context else await Versions(redis).contexts()
        return [info for name in contexts for info in await ScheduleClient(redis, name).list()]

    _show(with_redis(redis_url, job), json_output)


ScheduleId = Annotated[str, typer.Argument(help="The schedule's id.")]


def _change(
    name: str, schedule_id: str, context: str, app_ref: str | None, redis_url: str | None, json_output: bool
) -> None:
    registry = _registry(app_ref) if app_ref else None
    info = _with_client(redis_url, context, lambda c: getattr(c, name)(schedule_id), registry)
    _show([info], json_output)


@schedule_app.command("pause")
@reporting_errors
def pause(
    schedule_id: ScheduleId, context: ContextOption, redis_url: RedisUrl = None, json_output: Json = False
) -> None:
    """Pause a schedule: nothing starts; occurrences while paused are skipped."""
    _change("pause", schedule_id, context, None, redis_url, json_output)


@schedule_app.command("resume")
@reporting_errors
def resume(
    schedule_id: ScheduleId,
    context: ContextOption,
    app_ref: AppRef = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Resume a schedule from its next occurrence after now, and clear a broken mark.

    Refused when its saga is known not to exist: --app does not define it, or workers
    registered the context's sagas in Redis and it is not among them.
    """
    _change("resume", schedule_id, context, app_ref, redis_url, json_output)


@schedule_app.command("trigger")
@reporting_errors
def trigger(
    schedule_id: ScheduleId,
    context: ContextOption,
    app_ref: AppRef = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Run a schedule once now (its overlap policy applies), and clear a broken mark.

    Refused when its saga is known not to exist: --app does not define it, or workers
    registered the context's sagas in Redis and it is not among them.
    """
    _change("trigger", schedule_id, context, app_ref, redis_url, json_output)


@schedule_app.command("delete")
@reporting_errors
def delete(
    schedule_id: Annotated[str, typer.Argument(help="The schedule's id.")],
    context: ContextOption,
    redis_url: RedisUrl = None,
) -> None:
    """Delete a schedule (the sagas it started are not touched)."""
    _with_client(redis_url, context, lambda c: c.delete(schedule_id))
    emit_line(f"schedule {schedule_id} deleted")


@schedule_app.command("create")
@reporting_errors
def create(
    schedule_id: Annotated[str, typer.Argument(help="The schedule's id (unique in its context).")],
    context: ContextOption,
    saga: Annotated[str, typer.Option(help="The saga definition's name.")],
    data: Annotated[
        Any,
        typer.Option("--data", parser=_json_option, metavar="JSON", help="The saga's start data as JSON."),
    ] = "null",
    cron: Annotated[str, typer.Option(help="A 5-field cron expression, or @daily etc.")] = "",
    start_at: Annotated[
        datetime | None, typer.Option(help="Delayed start (ISO time with offset); once, without --cron.")
    ] = None,
    timezone: Annotated[str, typer.Option(help="IANA zone the cron and calendar are read in.")] = "UTC",
    overlap: Annotated[str, typer.Option(help="skip, buffer_one, allow_all or cancel_previous.")] = "skip",
    catch_up: Annotated[str, typer.Option(help="skip, run_once or run_all.")] = "skip",
    skip_weekends: Annotated[bool, typer.Option(help="Skip Saturdays and Sundays.")] = False,
    holiday: Annotated[list[str] | None, typer.Option(help="An ISO date to skip (repeatable).")] = None,
    holiday_calendar: Annotated[
        list[str] | None,
        typer.Option(help="Skip the public holidays of a country or region: DE, DE-BY, US-NY (repeatable)."),
    ] = None,
    replace: Annotated[bool, typer.Option(help="Replace a schedule with this id.")] = False,
    app_ref: AppRef = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Create a schedule that starts SAGA with DATA on a cron expression or at a later time.

    Refused when SAGA is known not to exist: --app does not define it, or workers registered
    the context's sagas in Redis and it is not among them. With --app the data is checked
    against the definition too.
    """
    if start_at is not None and start_at.tzinfo is None:
        raise UsageProblem("--start-at needs a UTC offset (e.g. 2026-12-01T09:00:00+01:00)")
    try:
        spec = msgspec.convert(
            {
                "id": schedule_id,
                "saga": saga,
                "context": context,
                "data": msgspec.Raw(msgspec.json.encode(data)),
                "cron": cron,
                "start_at_ms": int(start_at.timestamp() * 1000) if start_at else None,
                "timezone": timezone,
                "skip_weekends": skip_weekends,
                "holidays": tuple(holiday or ()),
                "holiday_calendars": tuple(holiday_calendar or ()),
                "overlap": overlap,
                "catch_up": catch_up,
            },
            type=Schedule,
        )
    except msgspec.ValidationError as error:  # an unparsable cron, zone, date: bad usage
        raise UsageProblem(str(error)) from error
    registry = _registry(app_ref) if app_ref else None
    info = _with_client(redis_url, context, lambda c: c.create(spec, replace=replace), registry)
    _show([info], json_output)
