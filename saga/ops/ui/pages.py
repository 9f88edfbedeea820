"""What the UI's pages show, built from what :class:`~saga.SagaAdmin` returns (no I/O here).

:class:`Filters` reads the sagas list's query string the way ``saga list`` reads its
options; :func:`compensations` puts a saga's undo attempts in the order they ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from saga.core.model import Attempt
from saga.core.states import StepStatus
from saga.errors import InvalidInput
from saga.ops.durations import parse_duration
from saga.ops.inspect import Inspection

PAGE = 50
"""Sagas on one page of the list, unless ``limit`` says otherwise."""
MAX_LIMIT = 500
"""The most sagas one page of the list shows."""
SORTS = {"stalest": "least recently moved first", "newest": "most recently moved first"}
"""The list's orders, by the ``sort`` parameter."""


@dataclass(frozen=True, slots=True)
class Filters:
    """The sagas list's filters, as given in its query string (``?status=failed&stuck_for=10m``).

    Attributes:
        statuses: Only sagas in these statuses (all when empty).
        definition: Only this definition name (empty: any).
        version: Only this version (empty: any).
        stuck_for: Only sagas not moved for this long (``10m``, ``2h``; empty: any).
        context: Only this bounded context (empty: every registered one).
        search: Only sagas whose id (the business key it was started under) holds this text.
        within: Only sagas that moved (or ended) within this long (``15m``, ``1d``; empty: any).
        moved_from: Only sagas that moved (or ended) at or after this ISO 8601 time (UTC
            unless it gives an offset; empty: any).
        moved_to: Only sagas that moved (or ended) at or before this ISO 8601 time.
        sort: ``stalest`` (least recently moved first) or ``newest``.
        offset: Sagas to skip (the page).
        limit: Sagas per page.

    """

    statuses: tuple[str, ...] = ()
    definition: str = ""
    version: str = ""
    stuck_for: str = ""
    context: str = ""
    search: str = ""
    within: str = ""
    moved_from: str = ""
    moved_to: str = ""
    sort: str = "stalest"
    offset: int = 0
    limit: int = PAGE

    @classmethod
    def of(cls, params: Any) -> Filters:
        """Read a query string's parameters (a Starlette ``QueryParams``); :class:`InvalidInput` if bad."""
        filters = cls(
            statuses=tuple(s for s in params.getlist("status") if s),
            definition=params.get("definition", "").strip(),
            version=params.get("version", "").strip(),
            stuck_for=params.get("stuck_for", "").strip(),
            context=params.get("context", "").strip(),
            search=params.get("q", "").strip(),
            within=params.get("within", "").strip(),
            moved_from=params.get("from", "").strip(),
            moved_to=params.get("to", "").strip(),
            sort=params.get("sort", "stalest").strip() or "stalest",
            offset=_whole(params.get("offset", "0"), "offset", 0, None),
            limit=_whole(params.get("limit", str(PAGE)), "limit", 1, MAX_LIMIT),
        )
        filters.arguments()  # every value checked before any Redis read
        return filters

    def arguments(self, now_ms: int = 0) -> dict[str, Any]:
        """The filters as :meth:`saga.SagaAdmin.list` takes them at ``now_ms`` (paging left out)."""
        if self.sort not in SORTS:
            raise InvalidInput(f"sort must be one of {', '.join(SORTS)}, not {self.sort!r}")
        after = [
            bound
            for bound in (
                None if not self.within else now_ms - (_duration(self.within, "moved within") or 0),
                _instant(self.moved_from, "from"),
            )
            if bound is not None
        ]
        before = _instant(self.moved_to, "to")
        if after and before is not None and max(after) > before:
            raise InvalidInput(
                "the time range ends before it begins: make 'to' later than 'from' and 'moved within'"
            )
        return {
            "status": list(self.statuses),
            "definition": self.definition or None,
            "version": _whole(self.version, "version", 1, None) if self.version else None,
            "context": self.context or None,
            "stuck_for_ms": _duration(self.stuck_for, "stuck for"),
            "moved_after_ms": max(after, default=None),
            "moved_before_ms": before,
            "newest_first": self.sort == "newest",
            "id_contains": self.search,
        }

    def link(self, **changes: Any) -> str:
        """The query string of these filters with ``changes`` (``?status=…&offset=50``)."""
        changed = replace(self, **changes)
        pairs: list[tuple[str, str | int]] = [("status", s) for s in changed.statuses]
        pairs += [
            (name, value)
            for name, value in (
                ("definition", changed.definition),
                ("version", changed.version),
                ("stuck_for", changed.stuck_for),
                ("context", changed.context),
                ("q", changed.search),
                ("within", changed.within),
                ("from", changed.moved_from),
                ("to", changed.moved_to),
                ("sort", "" if changed.sort == "stalest" else changed.sort),
            )
            if value
        ]
        if changed.offset:
            pairs.append(("offset", changed.offset))
        if changed.limit != PAGE:
            pairs.append(("limit", changed.limit))
        return "?" + urlencode(pairs)


def _duration(text: str, name: str) -> int | None:
    try:
        return parse_duration(text) if text else None
    except ValueError as error:
        raise InvalidInput(f"{name}: {error}") from None


def _instant(text: str, name: str) -> int | None:
    """An ISO 8601 time (UTC unless it gives an offset) in epoch milliseconds; None if empty."""
    if not text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"{name} must be a time like 2026-12-04T18:30 (UTC unless it ends in +hh:mm), not {text!r}"
        ) from None
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000)


def _whole(text: str, name: str, least: int, most: int | None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"{name} must be a whole number, not {text!r}") from None
    if value < least or (most is not None and value > most):
        bounds = f"from {least} to {most}" if most is not None else f"at least {least}"
        raise InvalidInput(f"{name} must be {bounds}, not {value}")
    return value


@dataclass(frozen=True, slots=True)
class Compensation:
    """One step's (or branch's) compensation as it ran: its attempts, oldest first."""

    step: str
    name: str
    status: StepStatus
    attempts: list[Attempt]

    @property
    def began_ms(self) -> int:
        """When its first attempt was sent."""
        return self.attempts[0].dispatched_ms


def compensations(found: Inspection) -> list[Compensation]:
    """Every compensation the saga ran, in the order they began.

    By when each first attempt was sent; at the same millisecond, as the engine orders
    them: later steps first, and a group's branches newest-completed first.
    """
    position = {step.name: index for index, step in enumerate(found.steps)}
    ran = [
        ((-position[s.name], 0), Compensation(s.name, s.compensation or "?", s.status, undone))
        for s in found.steps
        if (undone := [a for a in s.attempts if a.kind == "undo"])
    ]
    ran += [
        (
            (-position.get(b.group, len(position)), -b.completed),
            Compensation(b.key, b.compensation or "?", b.status, undone),
        )
        for b in found.branches
        if (undone := [a for a in b.attempts if a.kind == "undo"])
    ]
    return [c for _, c in sorted(ran, key=lambda r: (r[1].began_ms, r[0]))]


def status_counts(counts: Sequence[Any]) -> Mapping[str, int]:
    """Sagas per status, summed over definitions and versions (from a tally's counts)."""
    totals: dict[str, int] = {}
    for count in counts:
        totals[str(count.status)] = totals.get(str(count.status), 0) + count.count
    return totals


@dataclass(frozen=True, slots=True)
class Bar:
    """One attempt on the saga's time axis: where it begins and how wide it is, in percent."""

    label: str
    kind: str
    outcome: str
    began_ms: int
    took_ms: int | None
    left: float
    width: float


def step_bars(found: Inspection, now_ms: int) -> list[Bar]:
    """Every attempt of the saga's steps and branches on one time axis, in the order sent.

    The axis runs from the saga's start to its end (or ``now_ms`` while it runs); an
    attempt still running reaches the axis's end.
    """
    start = found.created_ms
    end = found.updated_ms if found.status.terminal else max(now_ms, found.updated_ms)
    span = max(1, end - start)
    labelled = [(s.name, a) for s in found.steps for a in s.attempts]
    labelled += [(b.key, a) for b in found.branches for a in b.attempts]
    bars = []
    for name, attempt in sorted(labelled, key=lambda pair: (pair[1].dispatched_ms, pair[0])):
        finished = attempt.ended_ms if attempt.ended_ms is not None else end
        left = 100 * max(0, attempt.dispatched_ms - start) / span
        bars.append(
            Bar(
                label=f"{name} #{attempt.n}",
                kind=attempt.kind,
                outcome=str(attempt.outcome or "running"),
                began_ms=attempt.dispatched_ms,
                took_ms=None if attempt.ended_ms is None else attempt.ended_ms - attempt.dispatched_ms,
                left=round(left, 2),
                width=round(max(0.5, min(100 - left, 100 * (finished - attempt.dispatched_ms) / span)), 2),
            )
        )
    return bars
