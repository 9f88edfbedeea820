"""What the relay needs from a database, and the figures it reports.

A :class:`RelayStore` hands out unsent rows inside a transaction (:meth:`~RelayStore.claim`),
then marks what became of them and commits (:meth:`~RelayStore.finish`) or gives them back
(:meth:`~RelayStore.release`). Nothing here remembers a position in the outbox: every claim
starts again from the oldest pending row, so a row that commits late, with an id below rows
already published, is found on the next claim (docs/relay.md, "Out-of-order commits").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from relay._publish import OutboxRow
from relay._sql import Dialect


class OutboxStats(msgspec.Struct, frozen=True, kw_only=True):
    """The outbox's backlog.

    Attributes:
        backlog: Rows committed and not yet sent.
        oldest_unsent_age_ms: Age of the oldest unsent row (``None`` when there is none),
            from its ``created_at_ms`` to ``checked_at_ms``.
        failed: Rows that could not be published (see ``saga relay failed``).
        checked_at_ms: When the figures were read, by the caller's clock.

    """

    backlog: int
    oldest_unsent_age_ms: int | None
    failed: int
    checked_at_ms: int


class FailedRow(msgspec.Struct, frozen=True, kw_only=True):
    """One outbox row the relay marked failed, and why."""

    id: int
    message_id: str
    stream: str
    type: str
    error: str
    failed_at_ms: int


class Claimed(msgspec.Struct, frozen=True):
    """The rows one claim hands out, and how many it held back for per-key order.

    Attributes:
        rows: Rows to publish now, in id order (locked until ``finish`` or ``release``).
        held_back: Pending rows seen but not handed out because an earlier row of their
            ordering key is still in flight (held by another relay). They are worth another
            look soon, without waiting for a NOTIFY.

    """

    rows: list[OutboxRow]
    held_back: int = 0


class RelayStore(Protocol):
    """The relay's side of one outbox database."""

    dialect: Dialect

    @property
    def database(self) -> str:
        """The database in metrics' labels: ``host:port/dbname`` or the SQLite file (no credentials)."""
        ...

    async def open(self) -> None:
        """Connect (and subscribe to wake-ups); check the schema version."""
        ...

    async def close(self) -> None:
        """Close every connection; safe to call on a broken or closed store."""
        ...

    async def claim(self, limit: int) -> Claimed:
        """Begin a transaction and return up to ``limit`` unsent rows to publish, in id order.

        On PostgreSQL the rows are locked (``FOR UPDATE SKIP LOCKED``) until :meth:`finish`
        or :meth:`release`. An empty result ends the transaction.
        """
        ...

    async def finish(
        self, sent: Sequence[tuple[int, str | None]], failed: Sequence[tuple[int, str]], now_ms: int
    ) -> None:
        """Mark rows sent (with their entry ids) or failed (with reasons) and commit."""
        ...

    async def release(self) -> None:
        """Roll the claim back: every claimed row stays pending."""
        ...

    async def wait(self, timeout_s: float) -> None:
        """Return when new rows may have committed (a NOTIFY), or after ``timeout_s``."""
        ...

    async def has_pending(self) -> bool:
        """Whether any committed row is unsent (including rows another relay holds)."""
        ...

    async def purge(
        self, sent_before_ms: int | None, inbox_before_ms: int | None, chunk: int, archive: bool
    ) -> int:
        """Delete (or archive) sent rows and inbox keys older than the cut-offs; return rows removed."""
        ...

    async def stats(self, now_ms: int) -> OutboxStats:
        """Read the backlog figures."""
        ...

    async def failed_rows(self, limit: int) -> list[FailedRow]:
        """The oldest rows marked failed."""
        ...

    async def requeue(self, ids: Sequence[int]) -> int:
        """Mark failed rows pending again (after fixing the cause); return how many."""
        ...
