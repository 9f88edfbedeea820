"""Flow control between deciding a round and committing it: slots first, then tokens.

The orchestrator decides a round of inbox entries, then, when any definition has a
concurrency key or any rate limit is declared, passes the round through its gates: the
slot gate (``saga/runtime/slot_gate.py``) holds the first commands of sagas that must wait
for a slot (or refuses a start whose key skips when busy), then the rate gate
(``saga/runtime/rate_gate.py``) takes a token for each command still going. A decision a
gate changed has its transition call built again (:meth:`FlowGates.rebuild`). After the
round commits, :meth:`FlowGates.after_commit` gives back the slots of the sagas that ended.
Without keys or limits, the gates cost one truth test per round.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from bus import Clock, Delivery, Envelope, Publisher
from bus.lowlevel import ScriptCall
from saga.core.decision import Decision
from saga.core.model import SagaState
from saga.definition.registry import Registry
from saga.runtime.rate_gate import RateGate
from saga.runtime.slot_gate import SlotGate, Verdicts
from saga.store.codec import Loaded

Item = tuple[int, Envelope, Delivery]
"""An inbox entry of a round: its index in the batch, the envelope, its delivery."""
Commit = tuple[Item, Decision, Loaded, SagaState | None]
"""A decided entry: the item, its decision, the saga as it will be, the saga before."""
Rebuild = Callable[[Decision], tuple[ScriptCall, Loaded]]
"""Builds a decision's transition call again (after a gate held some of its commands)."""
Refuse = Callable[[Item, BaseException], Awaitable[BaseException]]
"""Records a start's refusal for its client; the entry's outcome."""


class FlowGates:
    """One orchestrator's slot and rate gates (see the module docstring)."""

    def __init__(self, redis: Any, registry: Registry, clock: Clock, publisher: Publisher | None) -> None:
        self.rates = RateGate(redis, registry.limits, clock)
        """Tokens for the commands a rate limit applies to."""
        self.slots = SlotGate(redis, registry, clock, publisher)
        """Slots of concurrency keys for the sagas that have them."""
        self.active = self.rates.active or self.slots.active
        self._rebuild: dict[int, Rebuild] = {}

    def remember(self, decision: Decision, rebuild: Rebuild) -> None:
        """Keep how to build ``decision``'s transition call, for :meth:`rebuild` after a gate."""
        self._rebuild[id(decision)] = rebuild

    def rebuild(self, decision: Decision) -> tuple[ScriptCall, Loaded]:
        """The transition call of ``decision`` built again (after a gate held a command)."""
        return self._rebuild[id(decision)](decision)

    def forget(self, decisions: Iterable[Decision]) -> None:
        """Drop what :meth:`remember` kept for ``decisions`` (after their round).

        Only theirs: rounds of other partitions decided concurrently keep their own.
        """
        for decision in decisions:
            self._rebuild.pop(id(decision), None)

    async def before_commit(
        self,
        commits: list[Commit],
        calls: list[ScriptCall],
        outcomes: list[BaseException | None],
        refuse: Refuse,
    ) -> Verdicts | None:
        """Pass a decided round through the gates; ``commits`` and ``calls`` are updated in place.

        ``None`` when a gate could not ask Redis: every entry of the round fails with the
        error (left for redelivery) and nothing is committed. Refused entries leave the round
        with their refusal (a start's is recorded for its client); the others go on.
        """
        try:
            verdicts = Verdicts()
            pairs = [(decision, before) for _, decision, _, before in commits]
            changed: set[int] = set()
            if self.slots.active:
                verdicts = await self.slots.gate(pairs)
                changed |= verdicts.held
            if self.rates.active:
                going = [k for k in range(len(pairs)) if k not in verdicts.refused]
                changed |= {going[j] for j in await self.rates.gate([pairs[k] for k in going])}
            for k in changed - set(verdicts.refused):
                item, decision, _, before = commits[k]
                calls[k], after = self.rebuild(decision)
                commits[k] = (item, decision, after, before)
        except Exception as error:  # noqa: BLE001 - the bus classifies each entry's failure
            for (index, _, _), *_ in commits:
                outcomes[index] = error
            return None
        finally:
            self.forget(decision for _, decision, _, _ in commits)
        for k in sorted(verdicts.refused, reverse=True):
            item = commits[k][0]
            outcomes[item[0]] = await refuse(item, verdicts.refused[k])
            del commits[k], calls[k]
        return verdicts

    async def after_commit(
        self, verdicts: Verdicts | None, committed: Sequence[tuple[SagaState | None, Decision]]
    ) -> None:
        """After a round's commits: ``(before, decision)`` of each transition that committed."""
        if not self.slots.active:
            return
        await self.slots.release([(before, decision.state) for before, decision in committed])
        if verdicts is not None and (verdicts.waiting or verdicts.replaced):
            await self.slots.settle(verdicts, {id(decision) for _, decision in committed})
