"""Rate limits: a token bucket (rate, burst) over the commands of a participant or a step.

A :class:`RateLimit` names what it limits: a participant (every command sent to its stream,
from any saga of any context) or one saga's step (``"<saga>.<step>"``: that step's commands
and its branches'). Declared on the :class:`~saga.App` (``App(..., limits=[...])``) and on
the in-process runner, it is shared by every worker through one Redis bucket; an operator
changes it at run time (``saga limits set``). See docs/flow-control.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Final

from saga.definition.step import NAME
from saga.errors import DefinitionError

_RATE: Final = re.compile(r"(\d+(?:\.\d+)?)\s*/\s*(ms|s|sec|m|min|h|hour)")
_PER_S: Final = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_rate(text: str | float) -> float:
    """Commands per second from ``"50/s"``, ``"3000/min"``, ``"2/h"`` or a number (else ``ValueError``)."""
    if isinstance(text, str):
        found = _RATE.fullmatch(text.strip())
        if found is None:
            raise ValueError(f"rate {text!r}: write it as <number>/<s|min|h>, e.g. 50/s")
        rate = float(found[1]) / _PER_S[found[2]]
    else:
        rate = float(text)
    if not 0 < rate <= 1_000_000:
        raise ValueError(f"rate {text!r}: must be above 0 and at most 1,000,000/s")
    return rate


def check_burst(burst: int, name: str) -> int:
    """``burst`` when it is a whole number of tokens from 1 to 1,000,000."""
    if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 1_000_000:
        raise ValueError(f"rate limit {name!r}: burst must be a whole number from 1 to 1,000,000")
    return burst


def check_limit_name(name: str) -> str:
    """``name`` when it can name a limit (and so a key): a participant or ``<saga>.<step>``."""
    if not NAME.fullmatch(name) or ":" in name:
        raise ValueError(f"invalid rate limit name {name!r}: a participant or <saga>.<step>")
    return name


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket over the commands sent to a participant, or by one step.

    Attributes:
        name: A participant (``"payments"``: every command to its stream) or a saga's step
            (``"order_fulfilment.charge"``: that step's commands, compensations included).
        rate: The sustained rate: ``"50/s"``, ``"3000/min"``, or commands per second.
        burst: How many commands may go at once after a quiet spell (the bucket's size).

    A command over the limit waits as a durable timer until its token is due; see
    docs/flow-control.md. The rate and burst given here are the defaults: ``saga limits
    set`` overrides them in Redis for every worker.

    """

    name: str
    rate: str | float
    burst: int = 1
    per_second: float = field(init=False, repr=False, compare=False)
    """The rate in commands per second (from ``rate``)."""

    def __post_init__(self) -> None:
        try:
            check_limit_name(self.name)
            check_burst(self.burst, self.name)
            per_second = parse_rate(self.rate)
        except ValueError as error:
            raise DefinitionError(str(error)) from error
        object.__setattr__(self, "per_second", per_second)


class Limits:
    """The rate limits a worker (or the test runner) applies, found by what a command is.

    A command is limited by its participant's limit and by its step's (``<saga>.<step>``;
    a branch ``<group>#<i>`` counts as its group's step): the first declared of the two
    that applies. Empty, it costs one truth test per decision.
    """

    def __init__(self, limits: Iterable[RateLimit] = ()) -> None:
        self.by_name: dict[str, RateLimit] = {}
        for limit in limits:
            if limit.name in self.by_name:
                raise DefinitionError(f"rate limit {limit.name!r} is declared twice")
            self.by_name[limit.name] = limit

    def __bool__(self) -> bool:
        return bool(self.by_name)

    def __iter__(self) -> Iterator[RateLimit]:
        return iter(self.by_name.values())

    def applying(self, saga: str, step: str, participant: str) -> RateLimit | None:
        """The limit on a command of ``saga``'s ``step`` (or branch) to ``participant``, if any."""
        found = self.by_name.get(participant)
        if found is not None:
            return found
        return self.by_name.get(f"{saga}.{step.partition('#')[0]}")
