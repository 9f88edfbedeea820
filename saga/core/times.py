"""How the engine writes a moment in text it records or shows: one format everywhere."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_text(ms: int) -> str:
    """A Unix-ms time as ``2026-12-04 12:16:48Z`` (UTC, to the second)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")
