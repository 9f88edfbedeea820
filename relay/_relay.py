"""The relay: publishes committed outbox rows to their streams, exactly once per row.

One round: claim up to ``batch_size`` unsent rows (locked on PostgreSQL), publish them in
one pipeline (one script call per hash tag; each row deduped by its message id), mark them
sent or failed, commit. Then either go again at once (a full batch: more is waiting), or
wait for a NOTIFY (PostgreSQL) or the poll interval.

Why a row is published once: it is marked sent only after Redis took it, and the publish
script remembers its message id for ``dedupe_window_s``. A relay that dies between the two
leaves the row pending; whoever claims it next publishes it again and the script answers
"already published" without adding an entry, so the row is marked sent with no new entry.

Failures: a broken database link or an unreachable Redis rolls the round back (rows stay
pending) and the relay reconnects with capped, jittered back-off. Redis refusing writes (out
of memory) leaves the affected rows pending and backs off the same way. A row that can never
be published is marked failed with its reason and the others go on. :meth:`Relay.stop`
(SIGTERM in ``saga relay``) lets the round in flight finish, then returns.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass

import anyio

from bus import BusError, Clock, Redis, SystemClock
from bus.lowlevel import AFTER_CLAIM, AFTER_XADD_BEFORE_MARK_SENT, Backoff, crash_point, get_logger
from relay._config import RelayConfig
from relay._dsn import open_store
from relay._errors import DatabaseUnavailable, RelayError, RelayLocked
from relay._publish import publish_rows
from relay._store import FailedRow, OutboxStats, RelayStore

_log = get_logger("redsaga.relay")
_HELD_BACK_RETRY_S = 0.01


@dataclass(slots=True)
class RelayCounters:
    """What one relay did since it started.

    Attributes:
        rounds: Claims that returned rows.
        sent: Rows published and marked sent.
        repeats: Rows whose message id was already published within the dedupe window (a
            relay died before marking them, or two rows carry one message id), marked sent
            without a new entry.
        failed: Rows marked failed.
        deferred: Row deferrals (Redis refused a call, or per-key order across tags).
        purged: Sent rows and inbox keys removed by retention.
        outages: Rounds lost to a database or Redis outage.

    """

    rounds: int = 0
    sent: int = 0
    repeats: int = 0
    failed: int = 0
    deferred: int = 0
    purged: int = 0
    outages: int = 0


@dataclass(frozen=True, slots=True)
class Round:
    """What one round did: rows claimed, held back for order, and whether Redis refused some."""

    claimed: int
    held_back: int
    refused: bool


class Relay:
    """Publishes an outbox's committed rows to their streams (see the module docstring).

    Build it with :meth:`connect` from a DSN, or from a store. Run it with :meth:`run`
    until :meth:`stop`, or :meth:`run` with ``drain=True`` to return once the outbox is empty.
    """

    def __init__(
        self,
        store: RelayStore,
        redis: Redis,
        *,
        config: RelayConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.redis = redis
        self.config = config or RelayConfig()
        self.clock: Clock = clock or SystemClock()
        self.counters = RelayCounters()
        self._stopping = anyio.Event()
        self._wait_scope: anyio.CancelScope | None = None
        self._open = False
        self._next_purge_ms = 0
        self._log = _log.bind(dialect=store.dialect)

    @classmethod
    def connect(
        cls, dsn: str, redis: Redis, *, config: RelayConfig | None = None, clock: Clock | None = None
    ) -> Relay:
        """A relay for the outbox at ``dsn`` (``postgresql://…``, ``sqlite:///…``); opens nothing yet."""
        config = config or RelayConfig()
        return cls(open_store(dsn, config), redis, config=config, clock=clock)

    def stop(self) -> None:
        """Ask :meth:`run` to return after the round in flight (safe from a signal handler task)."""
        self._stopping.set()
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping.is_set()

    async def run(self, *, drain: bool = False) -> None:
        """Relay rows until :meth:`stop` (or, with ``drain``, until no row is left unsent).

        Outages are waited out with back-off; errors that waiting cannot fix (missing
        tables, a rejected statement) are raised.
        """
        backoff = Backoff(self.clock, cap_s=self.config.backoff_cap_s)
        try:
            while not self.stopping:
                try:
                    await self._ensure_open()
                    done = await self.step()
                    await self._purge_if_due()
                    if not done.refused:
                        backoff.reset()
                    if await self._pause_after(done, backoff, drain=drain):
                        return
                except (RelayError, BusError) as error:
                    if not error.retryable:
                        raise
                    await self._outage(error)
                    await self._unless_stopping(backoff.wait())
        finally:
            await self.close()

    async def _pause_after(self, done: Round, backoff: Backoff, *, drain: bool) -> bool:
        """Wait as the last round asks (not at all after a full batch); ``True`` once drained."""
        if done.refused:
            await self._unless_stopping(backoff.wait())
        elif done.claimed >= self.config.batch_size:
            pass
        elif done.held_back or (drain and done.claimed):
            await self._unless_stopping(self.clock.sleep(_HELD_BACK_RETRY_S))
        elif drain and not await self.store.has_pending():
            return True
        else:
            await self._wait_for_rows(drain)
        return False

    async def step(self) -> Round:
        """One round: claim, publish, mark. Raises on outages (the round is rolled back)."""
        claimed = await self.store.claim(self.config.batch_size)
        if not claimed.rows:
            return Round(0, claimed.held_back, refused=False)
        crash_point(AFTER_CLAIM)
        try:
            outcome = await publish_rows(self.redis, claimed.rows, self.config)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._release()
            raise
        crash_point(AFTER_XADD_BEFORE_MARK_SENT)
        await self.store.finish(outcome.sent, outcome.failed, self.clock.now_ms())
        repeats = sum(1 for _, entry in outcome.sent if entry is None)
        c = self.counters
        c.rounds += 1
        c.sent += len(outcome.sent) - repeats
        c.repeats += repeats
        c.failed += len(outcome.failed)
        c.deferred += len(outcome.deferred)
        for row_id, reason in outcome.failed:
            self._log.warning("outbox row cannot be published; marked failed", row=row_id, reason=reason)
        if repeats:
            self._log.info(
                "rows were published before a crash; marked sent without a new entry", rows=repeats
            )
        return Round(len(claimed.rows), claimed.held_back, refused=outcome.error is not None)

    async def purge(self) -> int:
        """Delete (or archive) sent rows and inbox keys past their retention; return how many."""
        now = self.clock.now_ms()
        sent_before = None if self.config.retention_s is None else now - int(self.config.retention_s * 1000)
        inbox = self.config.inbox_retention_s
        inbox_before = None if inbox is None else now - int(inbox * 1000)
        removed = await self.store.purge(
            sent_before,
            inbox_before,
            self.config.retention_chunk,
            archive=self.config.retention_mode == "archive",
        )
        self.counters.purged += removed
        if removed:
            self._log.info("retention removed old rows", rows=removed, mode=self.config.retention_mode)
        return removed

    async def stats(self) -> OutboxStats:
        """The outbox's backlog and the age of its oldest unsent row (safe while :meth:`run` runs).

        Read on a connection of its own, whether or not the relay is connected.
        """
        return await self.store.stats(self.clock.now_ms())

    async def failed_rows(self, limit: int = 100) -> list[FailedRow]:
        """The oldest rows marked failed, with their reasons."""
        await self._ensure_open()
        return await self.store.failed_rows(limit)

    async def requeue(self, ids: list[int] | None = None) -> int:
        """Mark failed rows pending again (after fixing what made them fail); ``None``: every one."""
        await self._ensure_open()
        if ids is None:
            ids = [row.id for row in await self.store.failed_rows(1_000_000)]
        return await self.store.requeue(ids)

    async def close(self) -> None:
        """Close the database connections (the Redis client belongs to the caller)."""
        self._open = False
        with anyio.CancelScope(shield=True):
            await self.store.close()

    async def _ensure_open(self) -> None:
        if not self._open:
            await self.store.open()
            self._open = True
            self._log.info("relay connected to its outbox", batch_size=self.config.batch_size)

    async def _release(self) -> None:
        try:
            await self.store.release()
        except RelayError:
            await self.close()  # a broken link rolls the transaction back by itself

    async def _outage(self, error: RelayError | BusError) -> None:
        self.counters.outages += 1
        if isinstance(error, RelayLocked):
            self._log.info("another relay holds this outbox; standing by", error=str(error))
        else:
            self._log.warning("outage; backing off", error=str(error), kind=type(error).__name__)
        if isinstance(error, DatabaseUnavailable | RelayLocked):
            await self.close()

    async def _purge_if_due(self) -> None:
        now = self.clock.now_ms()
        if now < self._next_purge_ms:
            return
        self._next_purge_ms = now + int(self.config.retention_interval_s * 1000)
        await self.purge()

    async def _wait_for_rows(self, drain: bool) -> None:
        timeout = min(self.config.poll_interval_s, 0.05) if drain else self.config.poll_interval_s
        if self.config.listen and self.store.dialect == "postgresql":
            await self._unless_stopping(self.store.wait(timeout))
        else:
            await self._unless_stopping(self.clock.sleep(timeout))

    async def _unless_stopping(self, wait: Awaitable[None]) -> None:
        """Await ``wait`` (a sleep or a NOTIFY wait), cut short when the relay is asked to stop.

        A cancel scope rather than a task group, so that an error from ``wait`` (a broken
        LISTEN connection) reaches :meth:`run` as itself, not wrapped in an exception group.
        """
        with anyio.CancelScope() as scope:
            self._wait_scope = scope
            if self.stopping:
                scope.cancel()
            try:
                await wait
            finally:
                self._wait_scope = None
