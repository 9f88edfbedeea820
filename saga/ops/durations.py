"""Durations for people: printed (``3m 20s``) and read back (``90s``, ``1h30m``, ``2d``)."""

from __future__ import annotations

import re


def human_ms(ms: int) -> str:
    """A duration for people: ``850ms``, ``12.5s``, ``3m 20s``, ``2h 5m``, ``3d 4h``."""
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def parse_duration(text: str) -> int:
    """``90s``, ``10m``, ``1h30m``, ``2d`` or plain seconds, in milliseconds (``ValueError`` if not)."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return int(float(text) * 1000)
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration (like 90s, 10m, 1h30m, 2d)")
    return int(sum(float(n) * _UNIT_MS[u] for n, u in parts))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
