"""Schedules end to end: on the runner, and on Redis (fakeredis and real) with a fake clock.

The must-hold: with overlap ``skip`` two runs never overlap, proven by advancing the clock
minute by minute through many periods while each run takes two and a half minutes, with two
workers (two schedulers) racing on Redis.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import anyio
import msgspec
import pytest
from structlog.testing import capture_logs

import bus
from bus import FakeClock
from saga import (
    App,
    EngineConfig,
    InvalidInput,
    SagaClient,
    SagaState,
    SagaStatus,
    SagaWorker,
    Schedule,
    ScheduleClient,
)
from saga.errors import ScheduleExists, ScheduleNotFound, UnknownDefinition
from saga.runtime.schedule_runner import BROKEN_RECHECK_MS, Scheduler
from saga.testing import SagaRunner
from tests.saga.report_sagas import MIDNIGHT, REPORTS, Report, every_minute, late_report, report

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
CONFIG = EngineConfig(bus=bus.BusConfig(lease_ms=10_000))
MINUTE = 60


def overlaps(states: Iterable[SagaState]) -> list[tuple[str, str]]:
    """Pairs of runs whose [start, end] intervals overlap (an unfinished run lasts forever)."""
    spans = sorted((s.created_ms, s.updated_ms if s.status.terminal else 2**62, s.id) for s in states)
    return [(a[2], b[2]) for a, b in itertools.pairwise(spans) if b[0] < a[1]]


# -- the runner ----------------------------------------------------------------------------


def test_runner_skip_never_overlaps_through_many_periods() -> None:
    runner = SagaRunner(report, start_time=MIDNIGHT)
    runner.add_schedule(every_minute(overlap="skip"))
    for _ in range(60):
        runner.advance(minutes=1)
        running = [i for i in runner.saga_ids if not runner.status(i).terminal]
        assert len(running) <= 1
    states = [runner.state(i) for i in runner.saga_ids]
    assert overlaps(states) == []
    assert 15 <= len(states) <= 21  # one run every three minutes
    state = runner.schedule_state("minutely")
    assert state.started == len(states)
    assert state.skipped == 60 - len(states) + 1


def test_runner_allow_all_overlaps_and_buffer_one_runs_back_to_back() -> None:
    allow = SagaRunner(report, start_time=MIDNIGHT)
    allow.add_schedule(every_minute(overlap="allow_all"))
    allow.advance(minutes=10)
    assert len(allow.saga_ids) == 11
    assert overlaps([allow.state(i) for i in allow.saga_ids]) != []

    buffered = SagaRunner(report, start_time=MIDNIGHT)
    buffered.add_schedule(every_minute(overlap="buffer_one"))
    buffered.advance(minutes=30)
    states = [buffered.state(i) for i in buffered.saga_ids]
    assert overlaps(states) == []
    # each run starts (within a recheck) when the previous ends: no idle minute between them
    gaps = [b.created_ms - a.updated_ms for a, b in itertools.pairwise(states)]
    assert all(0 <= gap <= CONFIG.schedule_recheck_ms for gap in gaps)


def test_runner_cancel_previous_cancels_the_running_one_then_starts_the_newest() -> None:
    runner = SagaRunner(report, start_time=MIDNIGHT)
    runner.add_schedule(every_minute(overlap="cancel_previous"))
    runner.advance(minutes=5)
    states = [runner.state(i) for i in runner.saga_ids]
    assert overlaps(states) == []
    assert [s.status for s in states[:-1]] == [SagaStatus.CANCELLED] * (len(states) - 1)
    assert all(s.cancel is not None and s.cancel.by == "schedule:minutely" for s in states[:-1])


def test_runner_dst_schedule_runs_when_the_gap_ends() -> None:
    from datetime import UTC, datetime

    start = datetime(2026, 3, 7, 12, 0, tzinfo=UTC)
    runner = SagaRunner(report, start_time=start)
    data = msgspec.Raw(msgspec.json.encode(Report(name="n", seconds=1)))
    runner.add_schedule(
        Schedule(
            id="nightly",
            saga="report",
            context=REPORTS,
            data=data,
            cron="30 2 * * *",
            timezone="America/New_York",
        )
    )
    runner.advance(days=3)
    assert runner.saga_ids == [
        "nightly@2026-03-08T07:00:00.000Z",  # 03:00 EDT: 02:30 did not exist that night
        "nightly@2026-03-09T06:30:00.000Z",  # 02:30 EDT
        "nightly@2026-03-10T06:30:00.000Z",
    ]


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        # 2026-03-29 02:30 does not exist in Berlin: it runs at 03:00 CEST
        ((2026, 3, 28), ["2026-03-29T01:00:00.000Z", "2026-03-30T00:30:00.000Z"]),
        # 2026-10-25 02:30 happens twice: it runs at the first (CEST), not again at 02:30 CET
        ((2026, 10, 24), ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]),
    ],
)
def test_runner_berlin_nightly_runs_once_on_both_dst_changes(
    start: tuple[int, int, int], expected: list[str]
) -> None:
    from datetime import UTC, datetime

    runner = SagaRunner(report, start_time=datetime(*start, 12, 0, tzinfo=UTC))
    data = msgspec.Raw(msgspec.json.encode(Report(name="n", seconds=1)))
    runner.add_schedule(
        Schedule(
            id="nightly",
            saga="report",
            context=REPORTS,
            data=data,
            cron="30 2 * * *",
            timezone="Europe/Berlin",
        )
    )
    runner.advance(days=2)
    assert runner.saga_ids == [f"nightly@{at}" for at in expected]


def test_runner_pause_resume_and_trigger() -> None:
    runner = SagaRunner(report, start_time=MIDNIGHT)
    runner.add_schedule(every_minute(overlap="allow_all"))
    runner.advance(minutes=2)
    assert len(runner.saga_ids) == 3
    runner.pause_schedule("minutely")
    runner.advance(minutes=10)
    assert len(runner.saga_ids) == 3
    runner.resume_schedule("minutely")
    runner.trigger_schedule("minutely")
    runner.run_until_idle()
    assert runner.saga_ids[-1].endswith("~manual")
    runner.advance(minutes=1)
    assert len(runner.saga_ids) == 5
    with pytest.raises(ScheduleNotFound):
        runner.pause_schedule("nope")
    with pytest.raises(ScheduleExists):
        runner.add_schedule(every_minute())


# -- Redis ---------------------------------------------------------------------------------


class Reports:
    def __init__(self, redis: bus.Redis, workers: int = 1) -> None:
        self.redis = redis
        self.clock = FakeClock(int(MIDNIGHT.timestamp() * 1000))
        self.app = App("reports", sagas=[report])
        self.workers = [
            SagaWorker(redis, self.app, config=CONFIG, clock=self.clock, consumer=f"w{n}")
            for n in range(workers)
        ]
        self.client = SagaClient(redis, self.app.registry, clock=self.clock, config=CONFIG)
        self.schedules = ScheduleClient(redis, REPORTS, registry=self.app.registry, clock=self.clock)

    async def idle(self) -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for worker in self.workers:
                    tg.start_soon(worker.run_until_idle)

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.idle()

    async def sagas(self) -> list[SagaState]:
        ids: list[str] = []
        for status in SagaStatus:
            ids += await self.client.list(status, limit=10_000)
        return [await self.client.get(i) for i in sorted(ids)]


async def test_schedules_are_stored_listed_paused_resumed_triggered_and_deleted(redis: bus.Redis) -> None:
    world = Reports(redis)
    info = await world.schedules.create(every_minute(overlap="allow_all"))
    assert info.state.next_ms == world.clock.now_ms()
    assert info.due_ms == world.clock.now_ms()
    with pytest.raises(ScheduleExists):
        await world.schedules.create(every_minute())
    await world.schedules.create(every_minute("other", overlap="skip"))
    assert [i.schedule.id for i in await world.schedules.list()] == ["minutely", "other"]

    await world.idle()
    assert len(await world.sagas()) == 2
    paused = await world.schedules.pause("minutely")
    assert paused.state.paused
    assert paused.due_ms is None
    await world.advance(5 * MINUTE)
    minutely = [s for s in await world.sagas() if s.id.startswith("minutely@")]
    assert len(minutely) == 1
    resumed = await world.schedules.resume("minutely")
    assert resumed.state.next_ms == world.clock.now_ms() + MINUTE * 1000
    await world.schedules.trigger("minutely")
    await world.idle()
    assert any(s.id.endswith("~manual") for s in await world.sagas())
    await world.schedules.delete("other")
    assert [i.schedule.id for i in await world.schedules.list()] == ["minutely"]
    with pytest.raises(ScheduleNotFound):
        await world.schedules.get("other")


async def test_invalid_schedule_data_is_refused_when_the_definition_is_known(redis: bus.Redis) -> None:
    world = Reports(redis)
    bad = Schedule(
        id="bad", saga="report", context=REPORTS, data=msgspec.Raw(b'{"nope": 1}'), cron="* * * * *"
    )
    with pytest.raises(InvalidInput):
        await world.schedules.create(bad)


async def test_redis_skip_never_runs_two_at_once_with_two_schedulers_racing(redis: bus.Redis) -> None:
    world = Reports(redis, workers=2)
    await world.schedules.create(every_minute(overlap="skip"))
    for minute in range(60):
        await world.advance(MINUTE if minute else 0)
        running = [s for s in await world.sagas() if not s.status.terminal]
        assert len(running) <= 1, [s.id for s in running]
    states = await world.sagas()
    assert overlaps(states) == []
    assert 15 <= len(states) <= 21
    info = await world.schedules.get("minutely")
    assert info.state.started == len(states)
    assert info.state.pending == []


async def test_a_scheduler_that_dies_after_claiming_leaves_the_start_to_the_next(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = Reports(redis)
    await world.schedules.create(every_minute(overlap="skip"))
    dying = Scheduler(redis, world.app.registry, report.context, clock=world.clock, config=CONFIG)

    async def crash(*_args: object) -> None:
        raise RuntimeError("killed between claim and start")

    monkeypatch.setattr(dying, "_act", crash)
    with pytest.raises(RuntimeError):
        await dying.tick()
    info = await world.schedules.get("minutely")
    assert len(info.state.pending) == 1  # claimed, not started
    assert await world.sagas() == []
    await world.advance(CONFIG.schedule_recheck_ms / 1000)  # a healthy scheduler finishes it first
    states = await world.sagas()
    assert [s.id for s in states] == [info.state.pending[0][0]]
    assert (await world.schedules.get("minutely")).state.pending == []
    await world.idle()
    assert len(await world.sagas()) == 1  # and never twice


async def test_catch_up_after_downtime_on_redis(redis: bus.Redis) -> None:
    world = Reports(redis)
    data = msgspec.Raw(msgspec.json.encode(Report(name="c", seconds=1)))
    await world.schedules.create(
        Schedule(
            id="all",
            saga="report",
            context=REPORTS,
            data=data,
            cron="*/10 * * * *",
            catch_up="run_all",
            overlap="allow_all",
        )
    )
    await world.schedules.create(
        Schedule(
            id="once", saga="report", context=REPORTS, data=data, cron="*/10 * * * *", catch_up="run_once"
        )
    )
    world.clock.advance(3600 + 5 * MINUTE)  # an hour of downtime: nothing ran
    await world.idle()
    ids = [s.id for s in await world.sagas()]
    assert len([i for i in ids if i.startswith("all@")]) == 7  # 00:00 … 01:00
    assert [i for i in ids if i.startswith("once@")] == ["once@2026-03-02T01:00:00.000Z"]


# -- a schedule for a saga that does not exist ------------------------------------------------


def unknown(schedule_id: str = "typo", saga: str = "nosuchsaga") -> Schedule:
    data = msgspec.Raw(msgspec.json.encode(Report(name=schedule_id)))
    return Schedule(id=schedule_id, saga=saga, context=REPORTS, data=data, cron="* * * * *")


async def test_an_unknown_saga_is_refused_when_the_app_is_known(redis: bus.Redis) -> None:
    world = Reports(redis)
    with pytest.raises(
        UnknownDefinition, match=r"no saga named 'nosuchsaga' in context 'reports' \(known: report\)"
    ):
        await world.schedules.create(unknown())
    assert await world.schedules.list() == []
    # one made where nothing could know (no app, no worker ever registered) is refused at trigger
    await ScheduleClient(redis, REPORTS, clock=world.clock).create(unknown())
    with pytest.raises(UnknownDefinition, match="no saga named 'nosuchsaga'"):
        await world.schedules.trigger("typo")
    with pytest.raises(UnknownDefinition, match="no saga named 'nosuchsaga'"):
        await world.schedules.resume("typo")
    assert (await world.schedules.get("typo")).state.triggers == []
    # a saga of another context is refused too
    elsewhere = msgspec.structs.replace(unknown("elsewhere", "report"), context="billing")
    with pytest.raises(InvalidInput, match="saga 'report' runs in context 'reports', not 'billing'"):
        await ScheduleClient(redis, "billing", registry=world.app.registry, clock=world.clock).create(
            elsewhere
        )


async def test_an_unknown_saga_is_refused_when_workers_registered_the_context_in_redis(
    redis: bus.Redis,
) -> None:
    world = Reports(redis)
    await world.workers[0].register()
    no_app = ScheduleClient(redis, REPORTS, clock=world.clock)  # the CLI without --app
    with pytest.raises(
        UnknownDefinition, match=r"no saga named 'nosuchsaga' in context 'reports' \(known: report\)"
    ):
        await no_app.create(unknown())
    assert await no_app.list() == []
    created = await no_app.create(every_minute())
    assert created.schedule.saga == "report"
    assert (await no_app.trigger("minutely")).state.triggers != []


async def test_a_worker_that_does_not_know_the_saga_marks_the_schedule_broken_once(redis: bus.Redis) -> None:
    world = Reports(redis, workers=2)
    await ScheduleClient(redis, REPORTS, clock=world.clock).create(unknown())  # nothing could know
    with capture_logs() as logs:
        for _ in range(240):  # two hours, a poll every 30 s, two schedulers racing
            await world.advance(30)
    broken = [log for log in logs if "schedule" in log["event"] and log.get("schedule") == "typo"]
    assert [(log["log_level"], log["event"]) for log in broken] == [
        ("error", "schedule marked broken: it names a saga this worker does not know")
    ]
    assert broken[0]["saga"] == "nosuchsaga"
    assert await world.sagas() == []
    info = await world.schedules.get("typo")
    assert info.state.broken is not None
    assert info.state.broken.reason == (
        "no saga named 'nosuchsaga' in context 'reports' is known to the worker that fired it "
        "(it knows: report)"
    )
    assert info.state.broken.at_ms == int(MIDNIGHT.timestamp() * 1000) + 30_000
    assert info.state.pending == []  # nothing was claimed
    assert info.due_ms is not None
    assert info.due_ms <= world.clock.now_ms() + BROKEN_RECHECK_MS  # looked at again, rarely


async def test_a_worker_that_knows_the_saga_repairs_a_broken_schedule(redis: bus.Redis) -> None:
    world = Reports(redis)  # its app has `report` only
    data = msgspec.Raw(msgspec.json.encode(Report(name="late", seconds=1)))
    late = Schedule(
        id="late", saga="late_report", context=REPORTS, data=data, cron="*/10 * * * *", catch_up="run_once"
    )
    await ScheduleClient(redis, REPORTS, clock=world.clock).create(late)
    await world.advance(0)
    assert (await world.schedules.get("late")).state.broken is not None

    newer = SagaWorker(redis, App("reports", sagas=[report, late_report]), config=CONFIG, clock=world.clock)
    with capture_logs() as logs:
        world.clock.advance(BROKEN_RECHECK_MS / 1000)
        await newer.run_until_idle()
    assert [log["event"] for log in logs if log.get("schedule") == "late"] == [
        "schedule repaired: this worker knows its saga"
    ]
    info = await world.schedules.get("late")
    assert info.state.broken is None
    assert info.state.last_started == "late@2026-03-02T00:00:00.000Z"  # the missed occurrence: run_once
    assert [s.id for s in await world.sagas()] == ["late@2026-03-02T00:00:00.000Z"]


async def test_re_creating_or_resuming_a_broken_schedule_clears_the_mark(redis: bus.Redis) -> None:
    world = Reports(redis)
    no_app = ScheduleClient(redis, REPORTS, clock=world.clock)
    await no_app.create(unknown())
    await world.advance(0)
    assert (await no_app.get("typo")).state.broken is not None
    for retry in (no_app.resume, no_app.trigger):  # nothing here knows better: the worker decides again
        assert (await retry("typo")).state.broken is None
        await world.advance(60)
        assert (await no_app.get("typo")).state.broken is not None

    fixed = await no_app.create(unknown(saga="report"), replace=True)
    assert fixed.state.broken is None
    await world.advance(60)
    assert (await no_app.get("typo")).state.broken is None
    assert [s.id for s in await world.sagas()] == ["typo@2026-03-02T00:03:00.000Z"]
