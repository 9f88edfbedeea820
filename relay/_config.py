"""Table names and the relay's configuration: defaults and validation in one place."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import Literal

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")


@dataclass(frozen=True, slots=True)
class Tables:
    """The names of the relay's tables and of its NOTIFY channel.

    Names are plain SQL identifiers (letters, digits, underscores; at most 48 characters so
    that index names derived from them stay under PostgreSQL's 63). They are checked here
    because they are written into SQL text; put the tables in another schema with the
    connection's ``search_path``.

    Attributes:
        outbox: Messages waiting for, or done with, the relay.
        inbox: Idempotency keys (and first replies) of messages a consumer has handled.
        archive: Where sent rows go when retention archives instead of deleting.
        versions: Applied schema migrations.
        channel: The PostgreSQL NOTIFY channel the outbox trigger signals on insert.

    """

    outbox: str = "redsaga_outbox"
    inbox: str = "redsaga_inbox"
    archive: str = "redsaga_outbox_archive"
    versions: str = "redsaga_relay_schema"
    channel: str = "redsaga_outbox"

    def __post_init__(self) -> None:
        names = (self.outbox, self.inbox, self.archive, self.versions, self.channel)
        for name in names:
            if not _IDENTIFIER.fullmatch(name):
                raise ValueError(
                    f"table or channel name {name!r} must be a plain identifier "
                    "([A-Za-z_][A-Za-z0-9_]*, at most 48 characters)"
                )
        tables = names[:4]
        if len({n.lower() for n in tables}) != len(tables):
            raise ValueError(f"table names must differ: {tables}")

    @classmethod
    def prefixed(cls, prefix: str) -> Tables:
        """Tables named ``<prefix>_outbox``, ``<prefix>_inbox``… (channel ``<prefix>_outbox``)."""
        return cls(
            outbox=f"{prefix}_outbox",
            inbox=f"{prefix}_inbox",
            archive=f"{prefix}_outbox_archive",
            versions=f"{prefix}_relay_schema",
            channel=f"{prefix}_outbox",
        )

    @property
    def lock_class(self) -> int:
        """The 32-bit advisory-lock class of this outbox's per-key write locks (PostgreSQL)."""
        return zlib.crc32(self.outbox.encode()) - (1 << 31)


RetentionMode = Literal["delete", "archive"]


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """How the relay reads, publishes, waits and cleans up.

    Attributes:
        tables: The table names (must match what ``init-db`` created).
        batch_size: Most rows claimed, published (one pipeline) and marked per round.
        poll_interval_s: Longest wait between looks at an idle outbox. On PostgreSQL a
            NOTIFY from the outbox trigger wakes the relay at once, so this is only the
            fallback; on SQLite it is the latency floor.
        listen: Use PostgreSQL ``LISTEN``/``NOTIFY`` wake-ups (polling stays as a fallback).
        dedupe_window_s: How long a published row's message id is remembered in Redis.
            A relay that dies after publishing and before marking rows sent re-publishes
            them on restart; within this window the repeat adds no stream entry. It must
            exceed the longest time a published row can stay unmarked (relay restart,
            database outage). Costs about 100 bytes of Redis memory per row published in
            the window.
        max_entry_bytes: Rows whose stream entry would be larger are marked failed.
        streams: If given, the only stream keys the relay publishes to; a row for any
            other stream is marked failed as unknown.
        create_streams: Whether a row may create its stream. When false, a row for a
            stream that does not exist in Redis is marked failed as unknown.
        retention_s: Sent rows older than this are deleted or archived; ``None`` keeps them.
        retention_mode: ``delete`` sent rows, or move them to ``tables.archive``.
        inbox_retention_s: Inbox keys older than this are deleted; ``None`` keeps them. A
            redelivery older than this is no longer recognised, so keep it well above the
            bus's delivery and retry horizon.
        retention_interval_s: How often the retention job runs.
        retention_chunk: Most rows deleted or archived per statement (short transactions).
        backoff_cap_s: Longest wait between reconnection attempts after an outage.
        db_timeout_s: Longest wait for PostgreSQL to answer one statement of a round
            (claim, mark, commit, rollback). Past it the link counts as dead (TCP keepalives
            do not fire while a request is unanswered, and a half-open link or a middlebox
            may answer nothing forever): the connection is closed, which rolls the round
            back, and the relay reconnects. Keep it above the slowest healthy round.
        sqlite_busy_timeout_ms: How long SQLite waits for a writer's lock before failing.

    """

    tables: Tables = field(default_factory=Tables)
    batch_size: int = 500
    poll_interval_s: float = 1.0
    listen: bool = True
    dedupe_window_s: float = 3600.0
    max_entry_bytes: int = (1 << 20) + (64 << 10)
    streams: frozenset[str] | None = None
    create_streams: bool = True
    retention_s: float | None = 7 * 86_400.0
    retention_mode: RetentionMode = "delete"
    inbox_retention_s: float | None = 30 * 86_400.0
    retention_interval_s: float = 60.0
    retention_chunk: int = 1000
    backoff_cap_s: float = 5.0
    db_timeout_s: float = 30.0
    sqlite_busy_timeout_ms: int = 5000

    def __post_init__(self) -> None:
        positive: dict[str, float] = {
            "batch_size": self.batch_size,
            "poll_interval_s": self.poll_interval_s,
            "dedupe_window_s": self.dedupe_window_s,
            "max_entry_bytes": self.max_entry_bytes,
            "retention_interval_s": self.retention_interval_s,
            "retention_chunk": self.retention_chunk,
            "backoff_cap_s": self.backoff_cap_s,
            "db_timeout_s": self.db_timeout_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"RelayConfig.{name} must be positive, got {value}")
        if self.batch_size > 10_000:
            raise ValueError(f"RelayConfig.batch_size must be at most 10000, got {self.batch_size}")
        for name, limit in (("retention_s", self.retention_s), ("inbox_retention_s", self.inbox_retention_s)):
            if limit is not None and limit < 0:
                raise ValueError(f"RelayConfig.{name} must be zero or more (or None), got {limit}")
        if self.retention_mode not in ("delete", "archive"):
            raise ValueError(
                f"RelayConfig.retention_mode must be 'delete' or 'archive', not {self.retention_mode!r}"
            )
        if self.sqlite_busy_timeout_ms < 0:
            raise ValueError("RelayConfig.sqlite_busy_timeout_ms must be zero or more")

    @property
    def dedupe_window_ms(self) -> int:
        """The dedupe window in milliseconds (what the publish script takes)."""
        return int(self.dedupe_window_s * 1000)
