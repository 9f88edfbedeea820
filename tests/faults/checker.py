"""The history checker: after a fault scenario, assert the invariants G1-G8 of docs/faults.md.

It reads what actually happened, not what the engine says it did: every saga's state,
history and status indexes in Redis, every stream's consumer groups and dead letters, and
the participant's PostgreSQL ``effects`` and ``attempts`` tables (``tests/faults/app.py``).
:meth:`Checker.quiesce` waits (bounded) until every started saga has ended and nothing is
pending; :meth:`Checker.check` then collects every violation and fails once, printing the
seed and, for each offending saga, its history, effects and attempts.

What each invariant means here:

- G1 every started saga is in exactly one end state (its status hash field and exactly one
  status index agree), and the one the test expected when it says which;
- G2 at most one effect per idempotency key (the effects table has a UNIQUE key; the check
  also proves the handler ran again, when the scenario made it, through the attempts log);
- G3 a compensated, cancelled or dead-lettered saga undid exactly its completed steps, each
  once, in strict reverse order of completion, after every step's effect; a completed saga
  has every step's effect and no undo; the effects agree with the saga's ``completed`` list
  and, when the test says what a saga's end implies (``implied``), equal exactly that
  list of ``(step, kind)`` in order: a check against the test's own model, not the engine's
  record (after a lost AOF tail or a failover, Redis forgets but PostgreSQL does not);
- G4 the revisions of a saga's applied history entries run 1, 2, 3, …, and no event
  (message id) was applied twice;
- G5 a worker whose lease on a command moved on (a :class:`Fence`) did not reach that
  command's effect transaction afterwards;
- G6 every dead letter has its source stream, entry id, group, consumer, delivery count,
  saga id, step, attempt, error chain, first and last failure time and the raw payload,
  and no entry was dead-lettered twice; a dead-lettered saga carries its error note;
- G7 every group of every stream of the context has nothing pending and no unread entry;
- G8 timers, stream lengths and the memory of the test's keys are below bounds.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psycopg

import bus
from saga import SagaClient, SagaState, SagaStatus
from saga.core.history_entry import HistoryEntry
from saga.store.keys import Partition, partition_of
from saga.store.redis_store import RedisStore
from tests.helpers import scan_keys

END_STATES = frozenset({*(s for s in SagaStatus if s.terminal), SagaStatus.DEAD_LETTERED})
UNDOING = frozenset({SagaStatus.COMPENSATED, SagaStatus.CANCELLED, SagaStatus.DEAD_LETTERED})
DEAD_LETTER_FIELDS = (
    "stream", "entry", "group", "consumer", "deliveries", "correlation_id", "header.step", "attempt",
    "errors", "first_failed_ms", "last_failed_ms",
)  # fmt: skip


@dataclass(frozen=True)
class Effect:
    """One row of the participant's ``effects`` table."""

    seq: int
    key: str
    saga_id: str
    step: str
    kind: str
    worker: str


@dataclass(frozen=True)
class Attempt:
    """One row of the participant's ``attempts`` log."""

    seq: int
    key: str
    saga_id: str
    step: str
    kind: str
    attempt: int
    delivery: int
    worker: str
    phase: str


@dataclass(frozen=True)
class Fence:
    """A lease that moved on: from attempts-log row ``since`` on, ``worker`` no longer held
    delivery ``delivery`` of attempt ``attempt`` of the command with idempotency key ``key``,
    so that delivery must not reach the effect (G5). A later attempt or delivery the worker
    is given anew (a retry after the step's timeout) is its own lease, not fenced."""

    worker: str
    key: str
    since: int
    attempt: int = 1
    delivery: int = 1


@dataclass
class Bounds:
    """G8 thresholds, checked once the load has stopped."""

    stream_entries_per_saga: int = 40
    timers: int = 0
    """Timers left once every saga ended (their timeouts are cancelled when they end)."""
    key_bytes: int = 64 * 1024 * 1024


@dataclass
class Checker:
    """Checks one scenario's sagas on one Redis database and one PostgreSQL schema."""

    redis: bus.Redis
    client: SagaClient
    pg_dsn: str
    schema: str
    context: str
    seed: int
    partitions: int = 1
    bounds: Bounds = field(default_factory=Bounds)
    effectless: frozenset[str] = frozenset({"nap"})
    """Steps that apply no participant effect (sleeps): left out of G3's comparison."""
    _problems: list[str] = field(default_factory=list)
    _suspects: set[str] = field(default_factory=set)

    # --- reading ---------------------------------------------------------------------------

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.pg_dsn, autocommit=True, options=f"-c search_path={self.schema}") as pg:
            return pg.execute(sql).fetchall()  # type: ignore[arg-type]

    def effects(self) -> list[Effect]:
        """Every effect, in the order they were applied."""
        return [
            Effect(*row)
            for row in self._rows(
                "SELECT seq, idem_key, saga_id, step, kind, worker FROM effects ORDER BY seq"
            )
        ]

    def attempts(self) -> list[Attempt]:
        """Every handler call, in order."""
        columns = "seq, idem_key, saga_id, step, kind, attempt, delivery, worker, phase"
        sql = f"SELECT {columns} FROM attempts ORDER BY seq"
        return [Attempt(*row) for row in self._rows(sql)]

    def partition(self, saga_id: str) -> Partition:
        """The partition of ``saga_id``."""
        return Partition(self.context, partition_of(saga_id, self.partitions))

    async def history(self, saga_id: str) -> list[HistoryEntry]:
        """A saga's history, oldest first."""
        return await RedisStore(self.redis, ttl_ms=0, cap=0).history(self.partition(saga_id), saga_id)

    async def streams(self) -> list[str]:
        """Every stream key of the context's partitions (inbox, command streams, dead letters)."""
        keys: list[str] = []
        for partition in self._partitions():
            pattern = f"rs:{{{partition.tag}}}:*"
            keys += [k.decode() for k in await scan_keys(self.redis, match=pattern, type_="STREAM")]
        return sorted(keys)

    def _partitions(self) -> list[Partition]:
        return [Partition(self.context, i) for i in range(self.partitions)]

    async def groups(self) -> dict[str, list[dict[str, Any]]]:
        """``XINFO GROUPS`` of every stream that exists: stream key -> groups."""
        return {key: await self.redis.xinfo_groups(key) for key in await self.streams()}

    async def dead_letters(self) -> list[dict[str, str]]:
        """Every dead letter of the context, fields decoded."""
        letters = []
        for partition in self._partitions():
            for _, fields in await self.redis.xrange(partition.inbox.dlq_key):
                letters.append({k.decode(): v.decode(errors="replace") for k, v in fields.items()})
        return letters

    # --- waiting ---------------------------------------------------------------------------

    async def ended(self, saga_ids: Iterable[str]) -> list[str]:
        """The sagas of ``saga_ids`` not in an end state yet (one pipelined round trip)."""
        ids = list(saga_ids)
        async with self.redis.pipeline(transaction=False) as pipe:
            for saga_id in ids:
                pipe.hget(self.partition(saga_id).saga(saga_id), "status")
            statuses = await pipe.execute()
        return [
            saga_id
            for saga_id, status in zip(ids, statuses, strict=True)
            if status is None or SagaStatus(status.decode()) not in END_STATES
        ]

    async def idle(self) -> bool:
        """Whether no group of the context has an entry pending or unread."""
        for stream, groups in (await self.groups()).items():
            for group in groups:
                if group["pending"] or await self._unread(stream, group):
                    return False
        return True

    async def _unread(self, stream: str, group: dict[str, Any]) -> int:
        """Entries of ``stream`` the group has not read (``lag``, or counted when Redis
        cannot tell it, after deletions)."""
        if group.get("lag") is not None:
            return int(group["lag"])
        info = await self.redis.xinfo_stream(stream)
        return int(info["entries-added"]) - int(group.get("entries-read") or 0)

    async def quiesce(self, saga_ids: Iterable[str], timeout: float) -> None:
        """Wait (bounded) until every saga has ended and nothing is pending; never fails.

        What did not settle in time is reported by :meth:`check` (G1, G7) with context.
        """
        import anyio

        ids = list(saga_ids)
        with anyio.move_on_after(timeout):
            while await self.ended(ids) or not await self.idle():
                await anyio.sleep(0.2)  # polling observable state

    # --- checking --------------------------------------------------------------------------

    def problem(self, invariant: str, text: str, saga_id: str | None = None) -> None:
        """Record one violation (and the saga to print with the report)."""
        self._problems.append(f"{invariant}: {text}")
        if saga_id:
            self._suspects.add(saga_id)

    async def check(
        self,
        saga_ids: Iterable[str],
        *,
        expect: Callable[[str], SagaStatus | set[SagaStatus] | None] | None = None,
        fenced: Iterable[Fence] = (),
        steps: Callable[[str], tuple[str, ...]] | None = None,
        dead_letters: int | None = None,
        implied: Callable[[SagaState], list[tuple[str, str]] | None] | None = None,
    ) -> None:
        """Check G1-G8 for ``saga_ids``; raise one ``AssertionError`` listing every violation.

        ``expect(saga_id)`` gives the end state(s) a saga must reach (``None``: any end);
        ``steps(saga_id)`` its definition's steps in order (for G3's completed sagas);
        ``fenced`` lists the leases that moved on (G5); ``dead_letters`` is the exact number
        of dead letters expected; ``implied(state)`` the effects, ``(step, kind)`` in order of
        application, that the saga's end state implies (``None``: not determined).
        """
        ids = list(saga_ids)
        effects, attempts = self.effects(), self.attempts()
        by_saga: dict[str, list[Effect]] = defaultdict(list)
        for effect in effects:
            by_saga[effect.saga_id].append(effect)
        self._g2(effects)
        for saga_id in ids:
            state = await self._g1(saga_id, expect)
            if state is None:
                continue
            self._g3(state, by_saga[saga_id], steps(saga_id) if steps else None)
            if implied is not None:
                self._g3_implied(state, by_saga[saga_id], implied(state))
            self._g4(state, await self.history(saga_id))
        self._g5(attempts, fenced)
        await self._g6(dead_letters)
        await self._g7()
        await self._g8(len(ids))
        if self._problems:
            raise AssertionError(await self._report(effects, attempts))

    async def _g1(
        self, saga_id: str, expect: Callable[[str], SagaStatus | set[SagaStatus] | None] | None
    ) -> SagaState | None:
        try:
            state = await self.client.get(saga_id)
        except Exception as error:
            self.problem("G1", f"{saga_id} cannot be loaded: {error!r}", saga_id)
            return None
        if state.status not in END_STATES:
            self.problem("G1", f"{saga_id} did not end: {state.status}", saga_id)
        partition = self.partition(saga_id)
        indexed = [
            s for s in SagaStatus if await self.redis.zscore(partition.by_status(s), saga_id) is not None
        ]
        if indexed != [state.status]:
            self.problem("G1", f"{saga_id} is {state.status} but indexed under {indexed}", saga_id)
        wanted = expect(saga_id) if expect else None
        if wanted is not None and state.status not in (
            {wanted} if isinstance(wanted, SagaStatus) else wanted
        ):
            self.problem("G1", f"{saga_id} ended {state.status}, expected {wanted}", saga_id)
        if state.status == SagaStatus.DEAD_LETTERED and (state.error is None or not state.error.what):
            self.problem("G6", f"{saga_id} is dead-lettered without its error note", saga_id)
        return state

    def _g2(self, effects: list[Effect]) -> None:
        for key, n in Counter(e.key for e in effects).items():
            if n > 1:
                self.problem("G2", f"{n} effects for idempotency key {key}", key.split(":")[0])

    def _g3(self, state: SagaState, effects: list[Effect], steps: tuple[str, ...] | None) -> None:
        saga_id = state.id
        done = [e.step for e in effects if e.kind == "do"]
        undone = [e.step for e in effects if e.kind == "undo"]
        completed = [s for s in state.completed if s not in self.effectless]
        if done != completed:
            self.problem("G3", f"{saga_id}: effects of {done} but the saga completed {completed}", saga_id)
        if state.status == SagaStatus.COMPLETED:
            if steps is not None and done != list(steps):
                self.problem("G3", f"{saga_id} completed with effects of {done}, not {list(steps)}", saga_id)
            if undone:
                self.problem("G3", f"{saga_id} completed but undid {undone}", saga_id)
            return
        if state.status == SagaStatus.FAILED and undone:
            self.problem("G3", f"{saga_id} failed (nothing to undo) but undid {undone}", saga_id)
        expected = list(reversed(done))
        complete = state.status in (SagaStatus.COMPENSATED, SagaStatus.CANCELLED)
        if (complete and undone != expected) or (not complete and undone != expected[: len(undone)]):
            self.problem(
                "G3",
                f"{saga_id} ({state.status}) undid {undone}; the reverse of {done} is {expected}",
                saga_id,
            )
        last_do = max((e.seq for e in effects if e.kind == "do"), default=0)
        if any(e.seq < last_do for e in effects if e.kind == "undo"):
            self.problem("G3", f"{saga_id}: an undo was applied before the last step's effect", saga_id)

    def _g3_implied(
        self, state: SagaState, effects: list[Effect], wanted: list[tuple[str, str]] | None
    ) -> None:
        got = [(e.step, e.kind) for e in effects]
        if wanted is not None and got != wanted:
            self.problem(
                "G3", f"{state.id} ({state.status}) left effects {got}; its end implies {wanted}", state.id
            )

    def _g4(self, state: SagaState, history: list[HistoryEntry]) -> None:
        saga_id = state.id
        applied = [h for h in history if not h.ignored]
        revisions = [h.revision for h in applied]
        if revisions != list(range(1, len(revisions) + 1)):
            self.problem("G4", f"{saga_id}: revisions {revisions}", saga_id)
        if revisions and state.revision != revisions[-1]:
            self.problem(
                "G4", f"{saga_id} is at revision {state.revision}, its history at {revisions[-1]}", saga_id
            )
        twice = [i for i, n in Counter(getattr(h.event, "id", "") for h in applied).items() if i and n > 1]
        if twice:
            self.problem("G4", f"{saga_id}: events {twice} were applied twice", saga_id)

    def _g5(self, attempts: list[Attempt], fenced: Iterable[Fence]) -> None:
        for fence in fenced:
            for attempt in attempts:
                late = attempt.seq > fence.since and attempt.phase in ("applied", "duplicate")
                held = (attempt.worker, attempt.key, attempt.attempt, attempt.delivery)
                if late and held == (fence.worker, fence.key, fence.attempt, fence.delivery):
                    text = f"fenced worker {fence.worker} reached its effect for {fence.key}"
                    self.problem("G5", text, attempt.saga_id)

    async def _g6(self, expected: int | None) -> None:
        letters = await self.dead_letters()
        if expected is not None and len(letters) != expected:
            sample = [(x.get("stream"), x.get("entry"), x.get("reason")) for x in letters[:3]]
            self.problem("G6", f"{len(letters)} dead letters, expected {expected}; the first: {sample}")
        for letter in letters:
            if letter.get("raw_missing") == "1" and "trimmed" in letter.get("reason", ""):
                continue  # a lost-entry report: there is no payload or delivery left to describe
            missing = [f for f in DEAD_LETTER_FIELDS if not letter.get(f)]
            if not any(k.startswith("raw.") for k in letter):
                missing.append("raw.*")
            if missing:
                self.problem(
                    "G6",
                    f"dead letter of {letter.get('entry')} lacks {missing}",
                    letter.get("correlation_id"),
                )
        for (stream, entry), n in Counter((x.get("stream"), x.get("entry")) for x in letters).items():
            if n > 1:
                self.problem("G6", f"{stream} {entry} was dead-lettered {n} times")

    async def _g7(self) -> None:
        for stream, groups in (await self.groups()).items():
            for group in groups:
                name = group["name"].decode()
                if group["pending"]:
                    self.problem("G7", f"{stream} group {name} has {group['pending']} entries pending")
                unread = await self._unread(stream, group)
                if unread:
                    self.problem("G7", f"{stream} group {name} has {unread} entries never read")

    async def _g8(self, sagas: int) -> None:
        for partition in self._partitions():
            timers = await self.redis.zcard(partition.timers)
            if timers > self.bounds.timers:
                self.problem("G8", f"{partition.timers} still holds {timers} timers")
        for stream in await self.streams():
            length = await self.redis.xlen(stream)
            if length > self.bounds.stream_entries_per_saga * max(1, sagas):
                self.problem("G8", f"{stream} holds {length} entries for {sagas} sagas")
        total = 0
        for key in await scan_keys(self.redis):
            total += await self.redis.memory_usage(key) or 0
        if total > self.bounds.key_bytes:
            self.problem("G8", f"the test's keys take {total} bytes (bound {self.bounds.key_bytes})")

    async def _report(self, effects: list[Effect], attempts: list[Attempt]) -> str:
        lines = [f"seed {self.seed}: {len(self._problems)} invariant violations", *self._problems[:40]]
        for saga_id in sorted(self._suspects)[:3]:
            lines.append(f"--- saga {saga_id}")
            for entry in await self.history(saga_id):
                event = msgspec.json.encode(entry.event).decode()
                lines.append(f"  r{entry.revision} {entry.status} {event[:300]} {entry.ignored}")
            lines += [f"  effect {e}" for e in effects if e.saga_id == saga_id]
            lines += [f"  attempt {a}" for a in attempts if a.saga_id == saga_id]
        return "\n".join(lines)
