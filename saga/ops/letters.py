"""Dead letters a page at a time: ``saga dlq list``, the UI's dead-letter page and the API."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from bus import DeadLetter


class LetterPage(msgspec.Struct, kw_only=True):
    """A page of dead letters, oldest first per stream; pass ``next_offset`` as ``offset`` for the next."""

    letters: list[DeadLetter]
    offset: int
    limit: int
    next_offset: int | None

    @classmethod
    def of(cls, found: Sequence[DeadLetter], *, offset: int, limit: int) -> LetterPage:
        """The page at ``offset`` of ``found``, read with one letter past the page to tell if more match."""
        more = len(found) > offset + limit
        return cls(
            letters=list(found[offset : offset + limit]),
            offset=offset,
            limit=limit,
            next_offset=offset + limit if more else None,
        )
