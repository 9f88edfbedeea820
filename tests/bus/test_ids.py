"""Message ids: UUIDv7 strings that sort by creation order within a process."""

from __future__ import annotations

import uuid

from bus import uuid7


def test_uuid7_is_a_canonical_version_7_uuid() -> None:
    for _ in range(1000):
        text = uuid7()
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122


def test_uuid7_sorts_by_creation_order() -> None:
    ids = [uuid7() for _ in range(10_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
