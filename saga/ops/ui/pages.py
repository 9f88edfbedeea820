"""What the UI's pages show, built from what :class:`~saga.SagaAdmin` returns (no I/O here).

:class:`Filters` reads the sagas list's query string the way ``saga list`` reads its
options; :func:`compensations` puts a saga's undo attempts in the order they ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

from saga.core.model import Attempt
from saga.core.states import StepStatus
from saga.errors import InvalidInput
from saga.ops.inspect import Inspection, parse_duration

PAGE = 50
"""Sagas on one page of the list, unless ``limit`` says otherwise."""
MAX_LIMIT = 500
"""The most sagas one page of the list shows."""


@dataclass(frozen=True, slots=True)
class Filters:
    """The sagas list's filters, as given in its query string (``?status=failed&stuck_for=10m``).

    Attributes:
        statuses: Only sagas in these statuses (all when empty).
        definition: Only this definition name (empty: any).
        version: Only this version (empty: any).
        stuck_for: Only sagas not moved for this long (``10m``, ``2h``; empty: any).
        context: Only this bounded context (empty: every registered one).
        offset: Sagas to skip (the page).
        limit: Sagas per page.

    """

    statuses: tuple[str, ...] = ()
    definition: str = ""
    version: str = ""
    stuck_for: str = ""
    context: str = ""
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
            offset=_whole(params.get("offset", "0"), "offset", 0, None),
            limit=_whole(params.get("limit", str(PAGE)), "limit", 1, MAX_LIMIT),
        )
        filters.arguments()  # every value checked before any Redis read
        return filters

    def arguments(self) -> dict[str, Any]:
        """The filters as :meth:`saga.SagaAdmin.list` takes them (paging left out)."""
        try:
            stuck_for_ms = parse_duration(self.stuck_for) if self.stuck_for else None
        except ValueError as error:
            raise InvalidInput(f"stuck for: {error}") from None
        return {
            "status": list(self.statuses),
            "definition": self.definition or None,
            "version": _whole(self.version, "version", 1, None) if self.version else None,
            "context": self.context or None,
            "stuck_for_ms": stuck_for_ms,
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
            )
            if value
        ]
        if changed.offset:
            pairs.append(("offset", changed.offset))
        if changed.limit != PAGE:
            pairs.append(("limit", changed.limit))
        return "?" + urlencode(pairs)


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
