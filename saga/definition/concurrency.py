"""Concurrency keys: at most ``limit`` sagas per business key at once, the others in line.

A :class:`Key` on a definition (``Saga(..., concurrency=Key(lambda d: d.account_id))``)
names a value of each saga's start data. A saga holds one of that value's ``limit`` slots
before it sends its first command; the sagas that find every slot taken wait in line,
durably, and go when a slot frees: highest priority first and, within a priority, the
fairness keys (tenants) by weight. Every worker and partition shares the line (its keys
live under a hash tag of their own: ``saga/store/slots.py``). See docs/flow-control.md.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Final

from saga.definition.step import NAME
from saga.errors import DefinitionError, InvalidInput

_VALUE: Final = re.compile(r"[A-Za-z0-9_.@+=-]{1,64}")
"""A key value used as it is in a key (else it is hashed: :func:`key_value`)."""
_TENANT: Final = re.compile(r"[A-Za-z0-9_.@+=-]{1,64}")
PRIORITIES: Final = range(10)
"""Priority levels: 0 (the default, lowest) to 9 (highest)."""


def key_value(value: object) -> str:
    """The text a key's value takes in Redis keys: itself when safe, else a digest of it.

    A value that could move a key under another principal's pattern (glob or hash-tag
    characters, spaces) or that is long is replaced by ``h.`` and 32 hex digits of its
    SHA-256, so any value works and none escapes its key.
    """
    text = value if isinstance(value, str) else str(value)
    if _VALUE.fullmatch(text):
        return text
    return "h." + hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Claim:
    """What one saga asks of its key: which line, at which priority, for which tenant."""

    value: str
    """The key's value as it appears in keys (:func:`key_value`)."""
    priority: int = 0
    tenant: str = ""
    """The fairness key (``""``: none)."""
    weight: int = 1
    """The tenant's weight (its share of the slots against the other tenants waiting)."""


@dataclass(frozen=True, slots=True)
class Key:
    """A concurrency key: at most ``limit`` sagas with the same value run at once.

    Attributes:
        value: The key's value from the saga's start data (``lambda d: d.account_id``).
            Any value works: one that is not a short safe name is hashed in Redis keys.
        limit: How many sagas with the same value may run at once (1: one at a time).
        name: The line's name, shared by every definition that names it (default: the
            saga's name). Definitions sharing a name must declare the same ``limit``.
        skip_if_running: A singleton's second mode: a start that finds every slot taken is
            refused (:class:`~saga.KeyBusy`) instead of waiting in line.
        debounce: A start waits this long before it takes its place in line; another start
            with the same value within that time replaces it (the earlier saga ends
            ``cancelled``, having run nothing), so a burst of starts runs once, with the
            last start's data.
        priority: The start's priority from its data (0 to 9, higher first; default 0).
        fairness: The start's fairness key (tenant) from its data: within a priority,
            tenants take turns by weight, so one tenant's bulk run cannot starve the others.
        weights: Tenants' weights (default 1): a tenant of weight 3 gets three slots for
            every one of a tenant of weight 1 while both wait.
        poll: Seconds between two looks of a waiting saga at its line. A freed slot wakes
            the next saga at once; the look is what recovers a wake-up lost in a crash.

    """

    value: Callable[[Any], object]
    limit: int = 1
    name: str = ""
    skip_if_running: bool = False
    debounce: timedelta | float | None = None
    priority: Callable[[Any], int] | None = None
    fairness: Callable[[Any], str] | None = None
    weights: Mapping[str, int] = field(default_factory=dict)
    poll: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or not 1 <= self.limit <= 100_000:
            raise DefinitionError(f"concurrency key {self.name!r}: limit must be a whole number 1-100,000")
        if self.name and (not NAME.fullmatch(self.name) or ":" in self.name):
            raise DefinitionError(f"invalid concurrency key name {self.name!r} (letters, digits, _ . -)")
        if self.skip_if_running and self.debounce is not None:
            raise DefinitionError("a concurrency key either skips or debounces, not both")
        if not 0.01 <= self.poll <= 3600:
            raise DefinitionError("a concurrency key's poll must be from 0.01 to 3600 seconds")
        if not 0 <= self.debounce_ms <= 86_400_000:
            raise DefinitionError("a concurrency key's debounce must be at most a day")
        for tenant, weight in self.weights.items():
            if not _TENANT.fullmatch(tenant) or isinstance(weight, bool) or not 1 <= weight <= 1000:
                raise DefinitionError(f"weight of tenant {tenant!r}: a safe name and a whole number 1-1000")

    @property
    def debounce_ms(self) -> int:
        """The debounce window in ms (0: none)."""
        window = self.debounce
        if window is None:
            return 0
        seconds = window.total_seconds() if isinstance(window, timedelta) else float(window)
        return round(seconds * 1000)

    @property
    def poll_ms(self) -> int:
        """:attr:`poll` in ms."""
        return round(self.poll * 1000)

    def named(self, saga: str) -> Key:
        """This key with its name filled in (``saga``'s name when none was given)."""
        if self.name:
            return self
        return replace(self, name=saga)

    def claim(self, data: Any) -> Claim:
        """What a saga with start ``data`` asks of the key (:class:`InvalidInput` if it is unusable).

        The key's functions are the application's code: one that raises is this start's bad
        input (refused), never the worker's failure.
        """
        try:
            value = self.value(data)
            priority = 0 if self.priority is None else self.priority(data)
            tenant = "" if self.fairness is None else self.fairness(data)
        except Exception as error:
            raise InvalidInput(
                f"concurrency key {self.name}: reading it from the data failed: {error!r}"
            ) from error
        if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
            raise InvalidInput(f"concurrency key {self.name}: priority {priority!r} is not a number 0-9")
        if tenant and (not isinstance(tenant, str) or not _TENANT.fullmatch(tenant)):
            raise InvalidInput(
                f"concurrency key {self.name}: fairness key {tenant!r} is not 1-64 of: letters digits _.@+=-"
            )
        return Claim(key_value(value), priority, tenant, self.weights.get(tenant, 1))
