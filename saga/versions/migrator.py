"""Running a migration over the in-flight sagas in Redis (``saga versions migrate``).

Each in-flight saga of the source version is loaded, shown to the user's function, and --
unless the run is a dry run -- moved by ``saga/store/lua/migrate.lua``, one atomic script per
saga that checks the revision it was decided on. A saga that moved in between is decided
again on its new state; one the function or the plan refuses is reported and left
untouched. Sagas are found through the per-status indexes of every partition, never by
scanning keys. Running a migration again is safe: migrated sagas are no longer on the
source version.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from bus import Clock, SystemClock, uuid7
from bus.lowlevel import redis_errors
from saga.core.history_entry import HistoryEntry
from saga.core.migration import Migration, current_step, decide_migration
from saga.core.model import SagaState
from saga.errors import MigrationRefused
from saga.store.codec import (
    STEP_PREFIX,
    Loaded,
    decode_state,
    encode_state,
    expected,
    migrated_revision,
    new_tag,
)
from saga.store.history import encode_entry, event_id
from saga.store.keys import Partition
from saga.store.records import START_PREFIX
from saga.store.scripts import MIGRATE
from saga.versions.registry import IN_FLIGHT, Versions

_ATTEMPTS: Final = 5

Outcome = Literal["migrated", "would_migrate", "refused", "skipped", "conflict"]


class MigrationResult(msgspec.Struct, kw_only=True, frozen=True):
    """What happened to one saga: moved (or would be, in a dry run), refused, or skipped.

    ``step`` is where the saga was, ``to_step`` where it is on the target version.
    """

    saga_id: str
    status: str
    outcome: Outcome
    step: str = ""
    to_step: str = ""
    reason: str = ""


class MigrationReport(msgspec.Struct, kw_only=True):
    """A migration run: one result per in-flight saga of the source version it found.

    ``remaining`` is the number of sagas still in flight on the source version afterwards
    (refused ones, and any started meanwhile -- drain the source version first).
    """

    migration: str
    dry_run: bool
    results: list[MigrationResult] = msgspec.field(default_factory=list)
    remaining: int = 0

    def count(self, outcome: Outcome) -> int:
        """How many sagas had ``outcome``."""
        return sum(1 for r in self.results if r.outcome == outcome)

    @property
    def ok(self) -> bool:
        """Whether no saga was refused or lost a race it could not win."""
        return not any(r.outcome in ("refused", "conflict") for r in self.results)


async def run_migration(
    redis: Any,
    migration: Migration,
    *,
    dry_run: bool = False,
    limit: int | None = None,
    by: str = "",
    clock: Clock | None = None,
    require_worker: bool = True,
) -> MigrationReport:
    """Move the in-flight sagas of ``migration.source`` to ``migration.target``.

    A dry run decides everything and writes nothing. Refused outright (nothing done) when
    the target version is drained, or -- unless ``require_worker`` is false -- when no
    running worker serves it (the moved sagas would be stranded).
    """
    clock = clock or SystemClock()
    source, target = migration.source, migration.target
    context = source.context
    versions = Versions(redis, clock=clock)
    if target.key in await versions.drained(context.name):
        raise MigrationRefused(f"{target.key} is drained: migrating sagas onto it is refused")
    if require_worker and not dry_run:
        served = {key for w in await versions.workers(context.name) for key in w.serves}
        if target.key not in served:
            raise MigrationRefused(
                f"no running worker serves {target.key}: deploy it first "
                "(the migrated sagas would be stranded)",
                saga=target.name,
                version=target.version,
            )
    report = MigrationReport(migration=migration.name, dry_run=dry_run)
    for index in range(context.partitions):
        partition = Partition(context.name, index)
        for saga_id in await _candidates(redis, partition):
            if limit is not None and len(report.results) >= limit:
                break
            result = await _migrate_one(
                redis, partition, migration, saga_id, dry_run=dry_run, by=by, clock=clock
            )
            if result is not None:
                report.results.append(result)
    report.remaining = (await versions.in_flight(context.name, context.partitions)).get(source.key, 0)
    return report


async def _candidates(redis: Any, partition: Partition) -> list[str]:
    ids: list[str] = []
    with redis_errors():
        for status in IN_FLIGHT:
            ids += [m.decode() for m in await redis.zrange(partition.by_status(status), 0, -1)]
    return list(dict.fromkeys(ids))


async def _migrate_one(
    redis: Any,
    partition: Partition,
    migration: Migration,
    saga_id: str,
    *,
    dry_run: bool,
    by: str,
    clock: Clock,
) -> MigrationResult | None:
    source, target = migration.source, migration.target
    attempted: tuple[str, MigrationResult] | None = None  # a commit answered 'conflict': its event id
    for _ in range(_ATTEMPTS):
        with redis_errors():
            raw = await redis.hgetall(partition.saga(saga_id))
        if not raw:
            return None
        loaded = decode_state(saga_id, raw, context=partition.context, partition=partition.index)
        state = loaded.state
        if (state.name, state.version) != (source.name, source.version) or state.status.terminal:
            # A commit that ran but lost its reply is re-sent by redis-py and answered
            # 'conflict': the saga moved because of this very call.
            if attempted is not None and await _last_event_id(redis, partition, saga_id) == attempted[0]:
                return attempted[1]
            return None
        step = current_step(source, state) or ""
        decision = decide_migration(migration, state, event_id=uuid7(), at_ms=clock.now_ms(), by=by)
        outcome: Outcome
        to_step = ""
        if decision.state is None or decision.event is None:
            outcome = "skipped" if decision.outcome == "skipped" else "refused"
        else:
            cursor = decision.state.cursor
            to_step = target.steps[cursor].name if cursor < len(target.steps) else ""
            outcome = "would_migrate" if dry_run else "migrated"
            if not dry_run:
                revision = migrated_revision(state)
                entry = HistoryEntry(event=decision.event, status=state.status, revision=revision)
                if not await _commit(
                    redis,
                    partition=partition,
                    loaded=loaded,
                    new_state=decision.state,
                    entry=entry,
                    clock=clock,
                ):
                    attempted = (decision.event.id, _result(state, outcome, step, to_step, decision.reason))
                    continue  # the saga moved since it was read: decide again on its new state
        return _result(state, outcome, step, to_step, decision.reason)
    return MigrationResult(
        saga_id=saga_id,
        status="",
        outcome="conflict",
        reason=f"the saga kept moving during {_ATTEMPTS} attempts; run the migration again",
    )


def _result(state: SagaState, outcome: Outcome, step: str, to_step: str, reason: str) -> MigrationResult:
    return MigrationResult(
        saga_id=state.id,
        status=state.status.value,
        outcome=outcome,
        step=step,
        to_step=to_step,
        reason=reason,
    )


async def _last_event_id(redis: Any, partition: Partition, saga_id: str) -> str:
    with redis_errors():
        last = await redis.lindex(partition.history(saga_id), -1)
    return event_id(last) if last else ""


async def _commit(
    redis: Any,
    *,
    partition: Partition,
    loaded: Loaded,
    new_state: SagaState,
    entry: HistoryEntry,
    clock: Clock,
) -> bool:
    state = loaded.state
    fields = encode_state(new_state)
    changed = [(k, v) for k, v in fields.items() if loaded.fields.get(k) != v]
    changed.append(("tag", new_tag().encode()))
    deleted = [k for k in loaded.fields if k.startswith((STEP_PREFIX, START_PREFIX)) and k not in fields]
    args: list[Any] = [
        expected(loaded),
        str(state.version),
        f"{state.name}@{state.version}",
        f"{new_state.name}@{new_state.version}",
        state.status.value,
        encode_entry(entry, new_state, before=state),
        clock.script_now_ms(),
        len(changed),
    ]
    for name, value in changed:
        args += [name, value]
    args += [len(deleted), *deleted]
    keys = [
        partition.saga(state.id),
        partition.history(state.id),
        partition.counts,
        partition.by_status(state.status.value),
    ]
    reply = await MIGRATE(redis, keys, args)
    outcome = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    return outcome == "ok"
