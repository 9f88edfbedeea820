"""The orchestrator's rate gate: a token for every limited command, or a durable wait.

Between deciding and committing a round of inbox entries, the gate takes one token per
command a :class:`~saga.definition.rate.RateLimit` applies to (all of the round's takes in one
pipelined batch; each limit's bucket is one single-slot script under its own hash tag:
``saga/store/rates.py``). A command whose token is promised for later is held
(``saga/core/rate_rules.py``): its transition starts a ``rate`` timer due then, and the
timers of the saga's partition fire it like any other. Tokens of held commands that a
decision gives up (cancelled, compensated, forced) go back in the same batch.

The bucket and the timers read one clock (Redis ``TIME``, or the injected clock in tests).
With no limit declared, the gate is never called: a truth test per round.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bus import Clock
from bus.lowlevel import ScriptCall, get_logger
from saga.core.decision import Decision
from saga.core.effects import Dispatch
from saga.core.model import SagaState
from saga.core.rate_rules import gives_back, hold, takes
from saga.definition.rate import Limits, RateLimit
from saga.store.rates import run_calls, take_call

_log = get_logger("redsaga.saga")


@dataclass
class RateTallies:
    """What the gate did, per limit (the metrics' labels: one per limit, never per saga)."""

    sent: Counter[str] = field(default_factory=Counter)
    """Commands that found a token at once."""
    delayed: Counter[str] = field(default_factory=Counter)
    """Commands held until their token was due."""
    delay_ms: Counter[str] = field(default_factory=Counter)
    """The total time held commands were promised to wait (ms)."""
    released: Counter[str] = field(default_factory=Counter)
    """Tokens given back by commands given up while they waited."""


class RateGate:
    """Takes rate limits' tokens for one orchestrator's decisions (see the module docstring)."""

    def __init__(self, redis: Any, limits: Limits, clock: Clock) -> None:
        self.redis = redis
        self.limits = limits
        self.clock = clock
        self.tallies = RateTallies()
        self.active = bool(limits)
        """Whether any limit is declared (a truth test per round: what a worker without limits pays)."""

    async def gate(self, decisions: Sequence[tuple[Decision, SagaState | None]]) -> set[int]:
        """Take the tokens of ``decisions`` (each with the saga before it); hold what must wait.

        Returns the indexes of the decisions it changed (their transition calls, if built
        already, must be built again: ``FlowGates.rebuild``). A take that fails (Redis unreachable)
        raises: the round is left for redelivery, as a failed commit would be.
        """
        now = self.clock.script_now_ms()
        requests: list[tuple[int, Dispatch, RateLimit]] = []
        calls: list[ScriptCall] = []
        releases: list[ScriptCall] = []
        for index, (decision, before) in enumerate(decisions):
            for dispatch, limit in takes(self.limits, decision.state, decision.effects):
                requests.append((index, dispatch, limit))
                calls.append(take_call(limit, dispatch.command_id, now_ms=now))
            for attempt, limit in gives_back(self.limits, before, decision.state, decision.effects):
                releases.append(take_call(limit, attempt.command_id, now_ms=now, release=True))
                self.tallies.released[limit.name] += 1
        if not calls and not releases:
            return set()
        results = await run_calls(self.redis, [*calls, *releases])
        for result in results:
            if isinstance(result, BaseException):
                raise result
        changed: set[int] = set()
        for (index, dispatch, limit), reply in zip(requests, results, strict=False):
            when, at = int(reply[0]), int(reply[1])
            if when <= at:
                self.tallies.sent[limit.name] += 1
                continue
            decision = decisions[index][0]
            decision.effects = hold(decision.state, decision.effects, dispatch, when, when - at)
            self.tallies.delayed[limit.name] += 1
            self.tallies.delay_ms[limit.name] += when - at
            changed.add(index)
            _log.debug(
                "command waits for its rate limit",
                limit=limit.name,
                saga_id=decision.state.id,
                wait_ms=when - at,
            )
        return changed
