"""How values read on the UI's pages: times, durations, JSON, links (the templates' filters).

Jinja2 escapes whatever these return; only :func:`at` returns markup, built with
``Markup.format``, which escapes every value it is given.
"""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import quote

import msgspec
from markupsafe import Markup

from saga.ops.durations import human_ms


def when(ms: int | None) -> str:
    """A Unix-ms time as ``2026-11-29 12:01:03.120Z`` (UTC, to the millisecond), or ``-``."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def at(ms: int | None) -> Markup | str:
    """A time as a ``<time>`` element, or ``-``.

    Its text is UTC as :func:`when` writes it; its ``datetime`` attribute holds the instant,
    for the page's script to show the reader's local time beside it.
    """
    if not ms:
        return "-"
    iso = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return Markup('<time datetime="{}">{}</time>').format(iso, when(ms))


def ago(ms: int | None) -> str:
    """A duration for people (``850ms``, ``3m 20s``), or ``-``."""
    return "-" if ms is None else human_ms(max(0, ms))


def pretty(raw: bytes | msgspec.Raw | None) -> str:
    """JSON indented for reading (text that is not JSON as it is)."""
    data = bytes(raw or b"null")
    try:
        return msgspec.json.format(data, indent=2).decode()
    except msgspec.DecodeError:
        return data.decode(errors="replace")


def saga_href(saga_id: str) -> str:
    """The path of a saga's page; every character of the id but letters and digits quoted.

    A saga id may hold ``/``, ``#``, ``%`` or ``&``: quoted, each stays part of the one path
    segment the route reads back.
    """
    return "/sagas/" + quote(saga_id, safe="")
