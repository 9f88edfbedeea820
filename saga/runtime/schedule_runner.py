"""Schedules in Redis: the store, the client, and the scheduler that starts their sagas.

Keys: :class:`~saga.store.keys.ScheduleKeys` (one hash tag per context, so every write is
one single-slot script, ``saga/store/lua/schedule_write.lua``).

Firing one due schedule, in three steps that are each safe to repeat:

1. **claim**: read the schedule, plan it (``saga.definition.schedule.plan``, pure) and write the new
   state with a compare-and-set on its revision. Of several schedulers planning the same
   occurrence one commits and the others do nothing. The claimed starts and cancels are
   written into the state as *pending*.
2. **act**: start each pending saga with an id derived from the schedule and the occurrence
   (``SagaClient.start`` is idempotent by id) and send each pending cancel.
3. **confirm**: remove what was done from the pending lists (compare-and-set again).

A scheduler that dies between 1 and 3 leaves pending work that the next one (or itself)
does first, with the same saga ids: no occurrence is lost and none starts twice. Starting
the saga cannot join the claim in one script because the saga lives in another slot. "Now"
is the timer clock's (Redis ``TIME``; the fake clock in tests), like every timer's.

A schedule must name a saga that exists. :class:`ScheduleClient` refuses one that does not
when it can know: its registry (the app) or the shapes workers registered in Redis for the
context list the sagas (``create``, ``resume`` and ``trigger`` check). Otherwise a worker
whose app does not know the saga marks the schedule *broken*: one compare-and-set write
records why in the schedule's state (``ScheduleState.broken``) and logs one error; the
schedule then starts nothing and is only looked at again every :data:`BROKEN_RECHECK_MS`,
silently, until a worker that knows the saga finds it, clears the mark in the same write
that claims its due occurrences (the catch-up policy decides about those missed meanwhile)
and logs once that it is repaired. Re-creating it (``create(..., replace=True)``) or
``resume``/``trigger`` clear the mark too; a worker that still does not know the saga marks
it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from bus import BusError, Clock, SystemClock
from bus.lowlevel import Backoff, get_logger, redis_errors
from saga.core.states import SagaStatus
from saga.definition.registry import Registry
from saga.definition.saga import Context, Saga
from saga.definition.schedule import Broken, Schedule, ScheduleState, first_state, plan
from saga.errors import (
    InvalidInput,
    ScheduleExists,
    ScheduleNotFound,
    UnknownDefinition,
)
from saga.runtime.client import SagaClient
from saga.runtime.config import EngineConfig
from saga.runtime.saga_cache import SagaCache
from saga.store.keys import ContextKeys, Partition, partition_of
from saga.store.scripts import SCHEDULE_WRITE
from saga.versions.records import parse_key

_json = msgspec.json.Encoder()
_spec_decoder = msgspec.json.Decoder(Schedule)
_state_decoder = msgspec.json.Decoder(ScheduleState)
_log = get_logger("redsaga.saga")
_CAS_TRIES: Final = 20
BROKEN_RECHECK_MS: Final = 60_000
"""How often a broken schedule is looked at again, so that a worker that knows its saga repairs it."""


class ScheduleInfo(msgspec.Struct, kw_only=True):
    """A stored schedule: what it is, what it has done, and when it is looked at next."""

    schedule: Schedule
    state: ScheduleState
    revision: int
    due_ms: int | None = None


async def timer_now(redis: Any, clock: Clock) -> int:
    """The timer clock's time: the fake clock's in tests, else Redis ``TIME``."""
    now = clock.script_now_ms()
    if now >= 0:
        return now
    with redis_errors():
        seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


@dataclass(frozen=True, slots=True)
class _Store:
    redis: Any
    context: str

    def keys(self) -> list[str]:
        return ContextKeys(self.context).schedules.all()

    async def load(self, schedule_id: str) -> ScheduleInfo | None:
        specs, states, revs, due = self.keys()
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hget(specs, schedule_id)
                pipe.hget(states, schedule_id)
                pipe.hget(revs, schedule_id)
                pipe.zscore(due, schedule_id)
                spec, state, revision, score = await pipe.execute()
        if spec is None or state is None:
            return None
        return ScheduleInfo(
            schedule=_spec_decoder.decode(spec),
            state=_state_decoder.decode(state),
            revision=int(revision or 0),
            due_ms=None if score is None else int(score),
        )

    async def write(
        self,
        schedule_id: str,
        expected: str,
        spec: Schedule | None,
        state: ScheduleState | None,
        due: int | None,
    ) -> tuple[str, int]:
        args = [
            schedule_id,
            expected,
            _json.encode(spec) if spec is not None else "",
            _json.encode(state) if state is not None else "",
            "" if due is None else due,
        ]
        outcome, revision = await SCHEDULE_WRITE(self.redis, self.keys(), args)
        return outcome.decode(), int(revision or 0)

    async def due(self, now_ms: int, limit: int) -> list[str]:
        with redis_errors():
            ids = await self.redis.zrangebyscore(self.keys()[3], "-inf", now_ms, start=0, num=limit)
        return [i.decode() for i in ids]

    async def ids(self) -> list[str]:
        with redis_errors():
            return sorted(i.decode() for i in await self.redis.hkeys(self.keys()[0]))


class ScheduleClient:
    """Create, read, pause, resume, trigger and delete the schedules of one context.

    :meth:`create`, :meth:`resume` and :meth:`trigger` refuse a schedule whose saga does not
    exist (:class:`UnknownDefinition`) when the sagas of the context are known here: from
    ``registry`` (the app), or from the shapes its workers registered in Redis. With a
    ``registry`` that knows the saga, :meth:`create` also checks the data against the
    definition; otherwise the scheduler checks it when it starts a run.
    """

    def __init__(
        self,
        redis: Any,
        context: str,
        *,
        registry: Registry | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.context = context
        self.registry = registry
        self.clock = clock or SystemClock()
        self._store = _Store(redis, context)
        self._redis = redis

    async def create(self, schedule: Schedule, *, replace: bool = False) -> ScheduleInfo:
        """Store ``schedule`` (:class:`ScheduleExists` if its id is taken, unless ``replace``).

        Creating the very same schedule again returns the stored one: the create is safe to
        repeat, as when redis-py re-sends it after losing the reply of a create that ran.
        """
        if schedule.context != self.context:
            raise InvalidInput(
                f"schedule {schedule.id!r} is for context {schedule.context!r}, not {self.context!r}"
            )
        definition = await self._check_saga(schedule)
        if definition is not None:
            definition.encode_data(schedule.data)
        now = await timer_now(self._redis, self.clock)
        state = first_state(schedule, now)
        outcome, _ = await self._store.write(
            schedule.id, "*" if replace else "", schedule, state, state.next_ms
        )
        if outcome == "exists":
            existing = await self._store.load(schedule.id)
            if existing is None or _json.encode(existing.schedule) != _json.encode(schedule):
                raise ScheduleExists(f"schedule {schedule.id!r} exists in context {self.context!r}")
            return existing
        return await self.get(schedule.id)

    async def get(self, schedule_id: str) -> ScheduleInfo:
        """The schedule and its state (:class:`ScheduleNotFound` if there is none)."""
        info = await self._store.load(schedule_id)
        if info is None:
            raise ScheduleNotFound(schedule_id)
        return info

    async def list(self) -> list[ScheduleInfo]:
        """Every schedule of the context, by id."""
        found = [await self._store.load(i) for i in await self._store.ids()]
        return [info for info in found if info is not None]

    async def pause(self, schedule_id: str) -> ScheduleInfo:
        """Stop starting sagas; occurrences while paused are skipped (running sagas go on)."""

        def change(state: ScheduleState, _now: int, info: ScheduleInfo) -> int | None:
            state.paused = True
            return info.due_ms if (state.pending or state.to_cancel) else None

        return await self._update(schedule_id, change)

    async def resume(self, schedule_id: str) -> ScheduleInfo:
        """Start again from the next occurrence after now (missed ones are not caught up).

        Clears a broken mark, after checking the saga exists (see the class docstring).
        """
        await self._check_saga((await self.get(schedule_id)).schedule)

        def change(state: ScheduleState, now: int, info: ScheduleInfo) -> int | None:
            state.paused = False
            state.broken = None
            state.next_ms = info.schedule.next_after(now)
            return state.next_ms if not (state.pending or state.to_cancel) else now

        return await self._update(schedule_id, change)

    async def trigger(self, schedule_id: str) -> ScheduleInfo:
        """Run once now, outside the calendar (the overlap policy still applies).

        Clears a broken mark, after checking the saga exists (see the class docstring).
        """
        await self._check_saga((await self.get(schedule_id)).schedule)

        def change(state: ScheduleState, now: int, _info: ScheduleInfo) -> int | None:
            state.broken = None
            state.triggers.append(now)
            return now

        return await self._update(schedule_id, change)

    async def delete(self, schedule_id: str) -> None:
        """Delete the schedule (sagas it started are not touched)."""
        await self.get(schedule_id)
        await self._store.write(schedule_id, "*", None, None, None)

    async def _check_saga(self, schedule: Schedule) -> Saga[Any] | None:
        """The schedule's definition if the registry has it; refuse a saga known not to exist.

        The saga exists if the registry or the shapes registered in Redis for the context
        name it. It is known not to when either lists sagas of the context (or the registry
        is an app's) and neither names it; with neither, nothing can be known here and the
        worker that fires the schedule decides.
        """
        definition = None
        if self.registry is not None:
            try:
                definition = self.registry.latest(schedule.saga)
            except UnknownDefinition:
                definition = None
        if definition is not None:
            if definition.context.name != self.context:
                raise InvalidInput(
                    f"schedule {schedule.id!r}: saga {schedule.saga!r} runs in context "
                    f"{definition.context.name!r}, not {self.context!r}"
                )
            return definition
        with redis_errors():  # the names only: a shape of a newer format need not be read
            keys = await self._redis.hkeys(ContextKeys(self.context).shapes)
        registered = {parse_key(key.decode())[0] for key in keys}
        if schedule.saga in registered:
            return None
        if registered or (self.registry is not None and len(self.registry) > 0):
            app = {d.name for d in self.registry or () if d.context.name == self.context}
            known = ", ".join(sorted(registered | app)) or "none"
            raise UnknownDefinition(
                f"schedule {schedule.id!r}: no saga named {schedule.saga!r} in context "
                f"{self.context!r} (known: {known})"
            )
        return None

    async def _update(
        self, schedule_id: str, change: Callable[[ScheduleState, int, ScheduleInfo], int | None]
    ) -> ScheduleInfo:
        for _ in range(_CAS_TRIES):
            info = await self.get(schedule_id)
            now = await timer_now(self._redis, self.clock)
            due = change(info.state, now, info)
            outcome, _ = await self._store.write(schedule_id, str(info.revision), None, info.state, due)
            if outcome == "ok":
                return await self.get(schedule_id)
        raise BusError(f"schedule {schedule_id!r} kept changing; try again")


class Scheduler:
    """Fires the due schedules of one context (see the module docstring for the steps).

    The sagas it starts are kept in ``cache`` as written (:class:`~saga.runtime.saga_cache.SagaCache`).
    """

    def __init__(
        self,
        redis: Any,
        registry: Registry,
        context: Context,
        *,
        clock: Clock,
        config: EngineConfig,
        cache: SagaCache | None = None,
    ) -> None:
        self.redis = redis
        self.registry = registry
        self.context = context
        self.clock = clock
        self.config = config
        self.client = SagaClient(redis, registry, clock=clock, config=config, source="scheduler", cache=cache)
        self._store = _Store(redis, context.name)

    async def tick(self, *, limit: int = 100) -> int:
        """Fire every schedule due now; return how many sagas were started."""
        now = await timer_now(self.redis, self.clock)
        started = 0
        for schedule_id in await self._store.due(now, limit):
            started += await self.fire(schedule_id, now)
        return started

    async def fire(self, schedule_id: str, now_ms: int) -> int:
        """Claim, act, confirm for one schedule; return how many sagas were started."""
        info = await self._store.load(schedule_id)
        if info is None:
            return 0
        definition = self._definition(info.schedule)
        if definition is None:
            await self._mark_broken(info, now_ms)
            return 0
        if info.state.pending or info.state.to_cancel:  # left by a scheduler that stopped
            await self._act(definition, info.schedule, info.state.pending, info.state.to_cancel)
            info = await self._confirm(schedule_id, info.state.pending, info.state.to_cancel)
            if info is None:
                return 0
        broken, info.state.broken = info.state.broken, None  # this worker knows the saga
        ended = await self._ended(info.state.runs)
        decided = plan(info.schedule, info.state, now_ms, ended, recheck_ms=self.config.schedule_recheck_ms)
        outcome, _ = await self._store.write(
            schedule_id, str(info.revision), None, decided.state, decided.due_ms
        )
        if outcome != "ok":
            return 0  # another scheduler claimed it
        if broken is not None:
            _log.info(
                "schedule repaired: this worker knows its saga",
                schedule=schedule_id,
                saga=info.schedule.saga,
                broken_since_ms=broken.at_ms,
            )
        for at in decided.skipped:
            _log.info("schedule occurrence skipped", schedule=schedule_id, occurrence_ms=at)
        started = await self._act(definition, info.schedule, decided.start, decided.cancel)
        await self._confirm(schedule_id, decided.start, decided.cancel)
        return started

    def _definition(self, schedule: Schedule) -> Saga[Any] | None:
        """The newest definition of the schedule's saga in this context, if this worker has one."""
        try:
            definition = self.registry.latest(schedule.saga)
        except UnknownDefinition:
            return None
        return definition if definition.context.name == self.context.name else None

    async def _mark_broken(self, info: ScheduleInfo, now_ms: int) -> None:
        """Record that the saga is unknown here (logged once), and look again later, silently."""
        state, first = info.state, info.state.broken is None
        known = ", ".join(sorted({d.name for d in self.registry if d.context.name == self.context.name}))
        if first:
            state.broken = Broken(
                reason=(
                    f"no saga named {info.schedule.saga!r} in context {self.context.name!r} is known "
                    f"to the worker that fired it (it knows: {known})"
                ),
                at_ms=now_ms,
            )
        outcome, _ = await self._store.write(
            info.schedule.id, str(info.revision), None, state, now_ms + BROKEN_RECHECK_MS
        )
        if outcome == "ok" and first:  # of several schedulers, the one whose write won logs
            _log.error(
                "schedule marked broken: it names a saga this worker does not know",
                schedule=info.schedule.id,
                saga=info.schedule.saga,
                context=self.context.name,
                known=known,
            )

    async def _act(
        self,
        definition: Saga[Any],
        schedule: Schedule,
        starts: Iterable[tuple[str, int]],
        cancels: Iterable[str],
    ) -> int:
        """Start and cancel (idempotent); return how many sagas were started."""
        started = 0
        for saga_id, _at in starts:
            try:
                await self.client.start(
                    definition,
                    schedule.data,
                    saga_id=saga_id,
                    by=f"schedule:{schedule.id}",
                    wait_s=0,  # the scheduler does not wait on another context's orchestrator
                )
                started += 1
            except InvalidInput as error:  # stored data no longer fits the definition: never will
                _log.error("schedule data is not valid for its saga", schedule=schedule.id, error=str(error))
        for saga_id in cancels:
            await self.client.cancel(
                saga_id,
                context=self.context.name,
                reason="a newer occurrence is due",
                by=f"schedule:{schedule.id}",
            )
        return started

    async def _confirm(
        self, schedule_id: str, starts: list[tuple[str, int]], cancels: list[str]
    ) -> ScheduleInfo | None:
        done = {saga_id for saga_id, _ in starts}
        for _ in range(_CAS_TRIES):
            info = await self._store.load(schedule_id)
            if info is None:
                return None
            state = info.state
            state.pending = [p for p in state.pending if p[0] not in done]
            state.cancelled += [c for c in state.to_cancel if c in cancels]
            state.to_cancel = [c for c in state.to_cancel if c not in cancels]
            outcome, revision = await self._store.write(
                schedule_id, str(info.revision), None, state, info.due_ms
            )
            if outcome == "ok":
                info.revision = revision
                return info
        return None

    async def _ended(self, runs: list[str]) -> set[str]:
        if not runs:
            return set()
        keys = [Partition(self.context.name, partition_of(r, self.context.partitions)).saga(r) for r in runs]
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hget(key, "status")
                statuses = await pipe.execute()
        return {
            run
            for run, status in zip(runs, statuses, strict=True)
            if status is None or SagaStatus(status.decode()).terminal
        }


async def run_schedules(schedulers: list[Scheduler], clock: Clock, config: EngineConfig) -> None:
    """Fire due schedules every ``schedule_poll_ms`` until cancelled."""
    backoff = Backoff(clock)
    while True:
        try:
            for scheduler in schedulers:
                await scheduler.tick()
            backoff.reset()
        except BusError as error:
            _log.warning("schedule loop failed; backing off", error=str(error))
            await backoff.wait()
            continue
        await clock.sleep(config.schedule_poll_ms / 1000)
