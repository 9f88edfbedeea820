"""Definition versions in Redis: shapes, drain, decommission, workers and stranded sagas.

The shape registry, drain and decommission, the workers that serve each version, stranded
instances; the records it keeps and the check behind ``saga versions check`` are in
:mod:`saga.versions.records`.

The keys (documented in ``saga/store/keys/``) are one family per context, under the context's
own hash tag: registered shapes, their registration records, drain notes, and the live
workers with what they serve. Drain flags also live in every partition
(``rs:{ctx:p}:drained``), because the start transition checks them in the same script that
creates the saga: once :meth:`Versions.drain` returns, no new saga starts on the version.

Who writes what: a :class:`~saga.SagaWorker` registers its definitions' shapes when it
starts (:meth:`Versions.register`, which refuses an incompatible change to a version with
sagas in flight) and renews what it serves on a heartbeat; operators drain, decommission and
migrate through :class:`Versions` (or ``saga versions``).

Counts come from the per-partition ``counts`` hashes the transition script keeps, so
nothing here scans keys. Reads that span partitions are not one atomic snapshot; the only
decision that depends on them being exact -- decommission -- requires the version to be
drained first, after which its in-flight count can only go down.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from bus import Clock, SystemClock
from bus.lowlevel import redis_errors
from saga.core.states import SagaStatus
from saga.definition.registry import Registry
from saga.definition.shape import Shape, decode_shape, encode_shape, shape_of
from saga.errors import IncompatibleChange, UnknownDefinition, VersionError, VersionInUse
from saga.store.keys import CONTEXTS, ContextKeys, Partition
from saga.store.scripts import REGISTER_SHAPE, WORKERS
from saga.versions.compatibility import Change, breaking, compare_shapes
from saga.versions.records import (
    ContextSnapshot,
    DrainNote,
    ParticipantRecord,
    Registration,
    RegistrationRecord,
    RegistrySnapshot,
    Stranded,
    VersionStatus,
    WorkerInfo,
    check_registry,
    next_version,
    parse_key,
)

IN_FLIGHT: Final = tuple(s.value for s in SagaStatus if not s.terminal)
"""Statuses of sagas that have not ended (dead-lettered ones wait for an operator: in flight)."""


class Versions:
    """Reads and manages definition versions in Redis (what ``saga versions`` calls).

    ``clock`` judges worker registrations' expiry (Redis ``TIME`` by default, so every
    process agrees).
    """

    def __init__(self, redis: Any, *, clock: Clock | None = None) -> None:
        self.redis = redis
        self.clock = clock or SystemClock()

    # -- reading ---------------------------------------------------------------------------

    async def contexts(self) -> list[str]:
        """Every context that has a version registry."""
        with redis_errors():
            members = await self.redis.smembers(CONTEXTS)
        return sorted(m.decode() for m in members)

    async def shape(self, context: str, name: str, version: int) -> Shape | None:
        """The shape registered for ``name@version`` in ``context`` (``None`` if none is)."""
        with redis_errors():
            raw = await self.redis.hget(ContextKeys(context).shapes, f"{name}@{version}")
        return None if raw is None else decode_shape(raw)

    async def shapes(self, context: str) -> dict[str, Shape]:
        """The shapes registered in ``context``, by ``name@version``."""
        with redis_errors():
            raw = await self.redis.hgetall(ContextKeys(context).shapes)
        return {k.decode(): decode_shape(v) for k, v in raw.items()}

    async def counts(self, context: str, partitions: int | None = None) -> dict[str, dict[str, int]]:
        """Sagas per ``name@version`` and status, summed over the context's partitions."""
        if partitions is None:
            partitions = await self._partitions(context)
        totals: dict[str, dict[str, int]] = {}
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                for index in range(partitions):
                    pipe.hgetall(Partition(context, index).counts)
                results = await pipe.execute()
        for raw in results:
            for field, value in raw.items():
                key, _, status = field.decode().rpartition("|")
                per_status = totals.setdefault(key, {})
                per_status[status] = per_status.get(status, 0) + int(value)
        return totals

    async def in_flight(self, context: str, partitions: int | None = None) -> dict[str, int]:
        """Sagas that have not ended, per ``name@version``."""
        counts = await self.counts(context, partitions)
        return {key: n for key, per in counts.items() if (n := sum(per.get(s, 0) for s in IN_FLIGHT))}

    async def workers(self, context: str) -> list[WorkerInfo]:
        """The live workers of ``context`` (registrations not yet expired).

        Only reads (a read-only operator user may list versions): expired registrations are
        skipped here and removed by the next worker's heartbeat.
        """
        keys = ContextKeys(context)
        now = self.clock.script_now_ms()
        with redis_errors():
            if now < 0:
                seconds, micros = await self.redis.time()
                now = seconds * 1000 + micros // 1000
            ids = await self.redis.zrangebyscore(keys.workers, f"({now}", "+inf")
            served = await self.redis.hmget(keys.served, ids) if ids else []
        return [msgspec.json.decode(s or b"{}", type=WorkerInfo) for s in served]

    async def participants(self, context: str) -> list[str]:
        """The participants workers ran for ``context`` (whose ``cmd:<name>`` streams exist)."""
        return sorted(await self.participant_records(context))

    async def participant_records(self, context: str) -> dict[str, ParticipantRecord]:
        """Each participant workers ran for ``context``, with the worker that last ran it.

        A name in the set without its record (which only that participant's user may write)
        was not registered by it and is left out.
        """
        keys = ContextKeys(context)
        with redis_errors():
            names = sorted(n.decode() for n in await self.redis.smembers(keys.participants))
            records = await self.redis.mget([keys.participant(n) for n in names]) if names else []
        return {
            name: msgspec.json.decode(raw, type=ParticipantRecord)
            for name, raw in zip(names, records, strict=True)
            if raw is not None
        }

    async def drained(self, context: str) -> dict[str, DrainNote]:
        """The drained versions of ``context`` with their notes."""
        with redis_errors():
            raw = await self.redis.hgetall(ContextKeys(context).drained)
        return {k.decode(): msgspec.json.decode(v, type=DrainNote) for k, v in raw.items()}

    async def snapshot(self, contexts: Iterable[str] | None = None) -> RegistrySnapshot:
        """Registered shapes and in-flight counts of ``contexts`` (default: every context)."""
        names = list(contexts) if contexts is not None else await self.contexts()
        snapshot = RegistrySnapshot(taken_ms=self.clock.now_ms())
        for context in names:
            shapes = await self.shapes(context)
            partitions = max((s.partitions for s in shapes.values()), default=1)
            snapshot.contexts[context] = ContextSnapshot(
                partitions=partitions, shapes=shapes, in_flight=await self.in_flight(context, partitions)
            )
        return snapshot

    async def check(self, registry: Registry) -> list[Change]:
        """Compare ``registry`` with the shapes registered in Redis (see :func:`check_registry`)."""
        return check_registry(await self.snapshot(registry.contexts), registry)

    async def status(self, context: str | None = None) -> list[VersionStatus]:
        """Every known version of ``context`` (default: all): registered, drained, served, counts."""
        rows: list[VersionStatus] = []
        for name in [context] if context else await self.contexts():
            shapes = await self.shapes(name)
            partitions = max((s.partitions for s in shapes.values()), default=1)
            counts = await self.counts(name, partitions)
            drained = await self.drained(name)
            serving: dict[str, int] = {}
            for worker in await self.workers(name):
                for key in worker.serves:
                    serving[key] = serving.get(key, 0) + 1
            for key in sorted(set(shapes) | set(counts) | set(drained), key=_sort_key):
                saga, version = parse_key(key)
                per_status = {s: n for s, n in counts.get(key, {}).items() if n}
                in_flight = sum(per_status.get(s, 0) for s in IN_FLIGHT)
                rows.append(
                    VersionStatus(
                        context=name,
                        saga=saga,
                        version=version,
                        registered=key in shapes,
                        fingerprint=shapes[key].fingerprint if key in shapes else "",
                        drained=drained.get(key),
                        workers=serving.get(key, 0),
                        in_flight=in_flight,
                        counts=per_status,
                        stranded=in_flight > 0 and not serving.get(key),
                    )
                )
        return rows

    async def stranded(self, contexts: Iterable[str] | None = None) -> list[Stranded]:
        """Versions with sagas in flight that no live worker serves (see :func:`stranded_instances`)."""
        stranded: list[Stranded] = []
        names = list(contexts) if contexts is not None else await self.contexts()
        for row in await self._rows(names):
            if row.stranded:
                counts = {s: n for s, n in row.counts.items() if s in IN_FLIGHT}
                stranded.append(
                    Stranded(
                        context=row.context,
                        saga=row.saga,
                        version=row.version,
                        in_flight=row.in_flight,
                        counts=counts,
                    )
                )
        return stranded

    async def _rows(self, contexts: list[str]) -> list[VersionStatus]:
        rows: list[VersionStatus] = []
        for context in contexts:
            rows += await self.status(context)
        return rows

    # -- registering -----------------------------------------------------------------------

    async def register(self, registry: Registry, *, by: str = "") -> Registration:
        """Register the shapes of ``registry``'s definitions; refuse incompatible changes.

        Idempotent. A version not registered yet is added; a safe change to a registered
        version replaces its shape. A breaking change is refused with
        :class:`IncompatibleChange` (naming the saga, the version and each problem) when the
        version has sagas in flight, and replaces the shape otherwise (reported in
        ``replaced``). Nothing is written when anything is refused.
        """
        report = Registration()
        for context in registry.contexts.values():
            for _ in range(10):
                if await self._register_context(registry, context.name, context.partitions, by, report):
                    break
            else:
                raise VersionError(f"context {context.name!r}: shapes kept changing under registration")
        return report

    async def _register_context(
        self, registry: Registry, context: str, partitions: int, by: str, report: Registration
    ) -> bool:
        keys = ContextKeys(context)
        with redis_errors():
            await self.redis.sadd(CONTEXTS, context)
            raw_shapes = await self.redis.hgetall(keys.shapes)
            raw_info = await self.redis.hgetall(keys.info)
        registered = {k.decode(): v for k, v in raw_shapes.items()}
        in_flight = await self.in_flight(context, partitions)
        snapshot = RegistrySnapshot(
            taken_ms=0,
            contexts={
                context: ContextSnapshot(
                    partitions=partitions, shapes={k: decode_shape(v) for k, v in registered.items()}
                )
            },
        )
        definitions = [d for d in registry if d.context.name == context]
        writes: list[tuple[str, bytes, bytes]] = []
        problems: list[Change] = []
        added: list[str] = []
        changed: list[Change] = []
        replaced: list[Change] = []
        for definition in definitions:
            shape = shape_of(definition)
            encoded = encode_shape(shape)
            old = registered.get(definition.key)
            if old == encoded:
                continue
            if old is None:
                added.append(definition.key)
                writes.append((definition.key, b"", encoded))
                continue
            changes = compare_shapes(
                decode_shape(old),
                shape,
                next_version=next_version(snapshot, definitions, definition.name),
            )
            bad = breaking(changes)
            if bad and in_flight.get(definition.key, 0):
                problems += bad
                continue
            (replaced if bad else changed).extend(bad or changes)
            writes.append((definition.key, old, encoded))
        if problems:
            first = problems[0]
            counts = {c.saga + "@" + str(c.version) for c in problems}
            raise IncompatibleChange(
                f"refusing to start: the code changed the shape of {', '.join(sorted(counts))} "
                f"incompatibly while sagas are in flight on it ({_in_flight_text(in_flight, counts)})",
                [c.line() for c in problems],
                saga=first.saga,
                version=first.version,
            )
        now = self.clock.now_ms()
        for key, old, encoded in writes:
            previous = raw_info.get(key.encode())
            first_ms = (
                msgspec.json.decode(previous, type=RegistrationRecord).registered_ms if previous else now
            )
            record = _json_encode(RegistrationRecord(registered_ms=first_ms, updated_ms=now, by=by))
            ok = await REGISTER_SHAPE(self.redis, [keys.shapes, keys.info], [key, old, encoded, record])
            if not int(ok):
                return False
        report.added += added
        report.changed += changed
        report.replaced += replaced
        return True

    async def register_participant(self, context: str, participant: str, *, by: str) -> None:
        """Record that a worker (``by``) runs ``participant`` for ``context``.

        Operators' tools read it to know the context's command streams without the code.
        """
        record = _json_encode(ParticipantRecord(by=by, at_ms=self.clock.now_ms()))
        keys = ContextKeys(context)
        with redis_errors():  # the record first: a name counts only with its record
            await self.redis.set(keys.participant(participant), record)
            await self.redis.sadd(keys.participants, participant)

    async def heartbeat(self, context: str, worker: WorkerInfo, ttl_ms: int) -> list[WorkerInfo]:
        """Register (or renew) ``worker`` in ``context`` for ``ttl_ms``; return the live workers."""
        return await self._workers(context, ["beat", worker.id, ttl_ms, _json_encode(worker)])

    async def leave(self, context: str, worker_id: str) -> None:
        """Remove a worker's registration (a graceful stop)."""
        await self._workers(context, ["leave", worker_id])

    async def _workers(self, context: str, args: list[Any]) -> list[WorkerInfo]:
        keys = ContextKeys(context)
        op, *rest = args
        reply = await WORKERS(
            self.redis, [keys.workers, keys.served], [op, self.clock.script_now_ms(), *rest]
        )
        pairs = reply[1:]
        return [msgspec.json.decode(pairs[i + 1], type=WorkerInfo) for i in range(0, len(pairs), 2)]

    # -- drain and decommission ------------------------------------------------------------

    async def locate(self, name: str, version: int, context: str | None = None) -> tuple[str, int]:
        """The context (and its partitions) where ``name@version`` is registered or has sagas."""
        key = f"{name}@{version}"
        found: list[tuple[str, int]] = []
        for candidate in [context] if context else await self.contexts():
            shapes = await self.shapes(candidate)
            partitions = max((s.partitions for s in shapes.values()), default=1)
            if key in shapes or key in await self.counts(candidate, partitions):
                found.append((candidate, partitions))
        if not found:
            where = f"context {context!r}" if context else "any context"
            raise UnknownDefinition(f"{key} is not registered in {where}")
        if len(found) > 1:
            raise UnknownDefinition(
                f"{key} is in several contexts ({', '.join(c for c, _ in found)}): name one"
            )
        return found[0]

    async def drain(
        self, name: str, version: int, *, context: str | None = None, by: str = "", reason: str = ""
    ) -> DrainNote:
        """Stop new starts on ``name@version``; sagas already running end on it. Idempotent.

        When this returns, every partition refuses new starts of the version (the start
        transition checks the flag in the same script).
        """
        context_name, partitions = await self.locate(name, version, context)
        key = f"{name}@{version}"
        note = DrainNote(at_ms=self.clock.now_ms(), by=by, reason=reason)
        with redis_errors():
            async with self.redis.pipeline(transaction=False) as pipe:
                for index in range(partitions):
                    pipe.sadd(Partition(context_name, index).drained, key)
                await pipe.execute()
            await self.redis.hsetnx(ContextKeys(context_name).drained, key, _json_encode(note))
        return (await self.drained(context_name)).get(key, note)

    async def undrain(self, name: str, version: int, *, context: str | None = None) -> None:
        """Allow new starts on ``name@version`` again."""
        context_name, partitions = await self.locate(name, version, context)
        key = f"{name}@{version}"
        with redis_errors():
            await self.redis.hdel(ContextKeys(context_name).drained, key)
            async with self.redis.pipeline(transaction=False) as pipe:
                for index in range(partitions):
                    pipe.srem(Partition(context_name, index).drained, key)
                await pipe.execute()

    async def decommission(self, name: str, version: int, *, context: str | None = None) -> None:
        """Unregister ``name@version``: refused unless it is drained and has nothing in flight.

        Draining first is what makes the in-flight count final: no new saga can start on a
        drained version, so a count of zero stays zero. The drain flags stay (a client with
        old code still cannot start it); the ended sagas' lifetime counts stay too.
        """
        context_name, partitions = await self.locate(name, version, context)
        key = f"{name}@{version}"
        if key not in await self.drained(context_name):
            raise VersionError(
                f"{key} is not drained: drain it first (saga versions drain {key}), so that no new "
                "saga starts on it, then decommission it once nothing is in flight",
                saga=name,
                version=version,
            )
        in_flight = (await self.in_flight(context_name, partitions)).get(key, 0)
        if in_flight:
            raise VersionInUse(
                f"{key} has {in_flight} sagas in flight: it can be decommissioned once they have ended "
                "(or been migrated)",
                saga=name,
                version=version,
                in_flight=in_flight,
            )
        keys = ContextKeys(context_name)
        with redis_errors():
            await self.redis.hdel(keys.shapes, key)
            await self.redis.hdel(keys.info, key)

    async def _partitions(self, context: str) -> int:
        return await self.registered_partitions(context) or 1

    async def registered_partitions(self, context: str) -> int | None:
        """The partition count ``context``'s registered versions declare (``None``: none registered)."""
        shapes = await self.shapes(context)
        return max((s.partitions for s in shapes.values()), default=None)


async def stranded_instances(
    redis: Any, contexts: Iterable[str] | None = None, *, clock: Clock | None = None
) -> list[Stranded]:
    """Sagas in flight on versions that no running worker serves, per version.

    Workers register what they serve with a heartbeat; a version with sagas in flight and
    no live registration is stranded: nothing moves those sagas until a worker serving it
    runs again (or they are migrated). ``saga stats`` and ``saga versions list`` show them;
    workers log them as errors.
    """
    return await Versions(redis, clock=clock).stranded(contexts)


def _in_flight_text(in_flight: dict[str, int], keys: set[str]) -> str:
    return ", ".join(f"{in_flight.get(k, 0)} on {k}" for k in sorted(keys))


def _sort_key(key: str) -> tuple[str, int]:
    name, version = parse_key(key)
    return name, version


def _json_encode(value: object) -> bytes:
    return msgspec.json.encode(value)
