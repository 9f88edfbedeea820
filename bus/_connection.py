"""A redis-py asyncio connection that packs commands with hiredis (C) when it is installed.

redis-py's asyncio connection packs every argument in Python; our scripts take dozens of
arguments (state fields, envelope fields), so packing was a quarter of a worker's CPU.
``hiredis.pack_command`` produces the same RESP bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio.connection import Connection

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency; the fallback keeps redis-py's
    _hiredis_pack = None


class FastConnection(Connection):
    """A :class:`redis.asyncio.Connection` whose ``pack_command`` is hiredis's."""

    def pack_command(self, *args: Any) -> list[bytes]:
        """Pack one command into RESP (command names with spaces are split like redis-py)."""
        if _hiredis_pack is None:
            return super().pack_command(*args)
        first = args[0]
        if (isinstance(first, str) and " " in first) or (isinstance(first, bytes) and b" " in first):
            args = (*first.split(), *args[1:])
        return [_hiredis_pack(args)]
