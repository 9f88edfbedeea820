"""Text that reaches a terminal or a diagram: every control character escaped.

A saga id, a step's error or a payload can hold escape sequences, newlines or bidi controls
written by whoever wrote the entry; printed raw they recolour or drive a terminal, split a
table row or a diagram line, or reorder what an operator reads. Everything redsaga prints for
people goes through :func:`printable`.
"""

from __future__ import annotations

import re
from typing import Final

_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    r"""``text`` with every control character escaped: ``\n``, ``\r``, ``\t``, ``\x1b``, ``\u202e``."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED_ESCAPES.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
