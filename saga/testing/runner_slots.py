"""The in-process runner's concurrency keys: the lines of ``slot.lua``, on the virtual clock.

The same rules as the Redis script (a test runs both on one sequence of calls), so a test
of a saga with a :class:`~saga.Key` sees what production would: a saga past its limit waits
as a ``slot`` timer, a freed slot wakes the next in line at once (highest priority first,
tenants by weight, each tenant's in arrival order), a singleton that skips refuses, a
debounced burst runs its last start. ``advance`` moves the looks of waiting sagas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bus import FakeClock
from saga.core.decision import Decision
from saga.core.model import SagaState
from saga.core.slot_rules import ended, gives_up_slot, hold_for_slot, needing_slot, slot_timers
from saga.definition.concurrency import Claim
from saga.definition.registry import Registry
from saga.errors import KeyBusy
from saga.store.slots import BUSY, GRANTED, REPLACED, WAITING, Mode, ref_of

Woken = list[tuple[str, list[str]]]
"""Sagas given a slot (ref, the timers that wake them)."""


@dataclass
class Line:
    """One value's line: the holders and the sagas waiting, as ``slot.lua`` keeps them."""

    holders: dict[str, int] = field(default_factory=dict)
    waiting: dict[str, tuple[int, str, int, list[str]]] = field(default_factory=dict)
    """ref -> (priority, tenant, arrival, timers)."""
    arrivals: int = 0
    passes: dict[int, dict[str, float]] = field(default_factory=dict)
    """priority -> tenant -> pass (the tenants with sagas in line)."""
    served: dict[int, float] = field(default_factory=dict)
    """priority -> the pass last served."""
    weights: dict[str, int] = field(default_factory=dict)
    pending: str | None = None

    def acquire(self, ref: str, limit: int, claim: Claim, timers: list[str], mode: Mode) -> int:
        """Take a slot or wait (the verdict); :meth:`fill` gives slots to the line."""
        if ref in self.holders:
            return GRANTED
        if mode == "debounced" and ref not in self.waiting:
            if self.pending != ref:
                return REPLACED
            self.pending = None
        if mode == "skip" and (len(self.holders) >= limit or self.waiting):
            return BUSY
        if ref in self.waiting:
            self.waiting[ref] = (*self.waiting[ref][:3], timers)
        else:
            self.arrivals += 1
            self.waiting[ref] = (claim.priority, claim.tenant, self.arrivals, timers)
            self.weights[claim.tenant] = claim.weight
            tenants = self.passes.setdefault(claim.priority, {})
            tenants.setdefault(claim.tenant, self.served.get(claim.priority, 0.0))
        return WAITING

    def release(self, ref: str) -> None:
        """Give back ``ref``'s slot or place (nothing if it has neither)."""
        self.holders.pop(ref, None)
        if ref in self.waiting:
            priority, tenant, _, _ = self.waiting.pop(ref)
            self._leave_if_empty(priority, tenant)
        if self.pending == ref:
            self.pending = None

    def fill(self, limit: int, now: int) -> Woken:
        """Give free slots to the line, in its order; whom it gave them to."""
        woken: Woken = []
        while len(self.holders) < limit and self.passes:
            priority = max(self.passes)
            tenants = self.passes[priority]
            tenant = min(tenants, key=lambda t: (tenants[t], t))
            ref = min(
                (r for r, w in self.waiting.items() if w[0] == priority and w[1] == tenant),
                key=lambda r: self.waiting[r][2],
            )
            woken.append((ref, self.waiting.pop(ref)[3]))
            self.holders[ref] = now
            self.served[priority] = tenants[tenant]
            tenants[tenant] += 1 / self.weights.get(tenant, 1)
            self._leave_if_empty(priority, tenant)
        return woken

    def _leave_if_empty(self, priority: int, tenant: str) -> None:
        if any(w[0] == priority and w[1] == tenant for w in self.waiting.values()):
            return
        tenants = self.passes.get(priority, {})
        tenants.pop(tenant, None)
        if not tenants:
            self.passes.pop(priority, None)
            self.served.pop(priority, None)


class MemorySlots:
    """Every line of one runner, and its gate (see the module docstring)."""

    def __init__(self, registry: Registry, clock: FakeClock) -> None:
        self.registry = registry
        self.clock = clock
        self.lines: dict[tuple[str, str, str], Line] = {}
        self.active = any(d.concurrency is not None for d in registry)

    def gate(
        self, decision: Decision, before: SagaState | None, wake: Callable[[str, str, str], None]
    ) -> str | None:
        """Ask the line for ``decision``'s saga; hold what must wait.

        ``wake(context, ref, timer)`` moves a timer to now. Returns the id of the saga to
        cancel (replaced), if any; raises :class:`KeyBusy` for a start refused.
        """
        state = decision.state
        definition = self.registry.get(state.name, state.version)
        key = definition.concurrency
        if key is None or gives_up_slot(state.status):
            return None
        dispatches = needing_slot(before, decision.effects)
        if not dispatches:
            return None
        claim = key.claim(definition.decode_data(bytes(state.data)))
        line = self.lines.setdefault((state.context, key.name, claim.value), Line())
        ref, now = ref_of(state.partition, state.id), self.clock.now_ms()
        if key.debounce_ms and before is None:
            line.pending = ref
            hold_for_slot(decision, dispatches, now + key.debounce_ms, key.debounce_ms)
            return None
        mode: Mode = "skip" if key.skip_if_running and before is None else "wait"
        mode = "debounced" if key.debounce_ms else mode
        verdict = line.acquire(ref, key.limit, claim, slot_timers(state, dispatches), mode)
        woken = line.fill(key.limit, now)
        for other, timers in woken:
            if other != ref:
                for timer in timers:
                    wake(state.context, other, timer)
        if verdict == BUSY:
            raise KeyBusy(
                f"saga {state.id} not started: {key.name} {claim.value!r} has every slot taken "
                f"({key.limit}) and skips when busy",
                key=key.name,
                value=claim.value,
            )
        if ref in line.holders:
            return None
        hold_for_slot(decision, dispatches, now + key.poll_ms, key.poll_ms)
        return state.id if verdict == REPLACED else None

    def release(
        self, before: SagaState | None, after: SagaState, wake: Callable[[str, str, str], None]
    ) -> None:
        """Give back the slot of a saga the decision from ``before`` to ``after`` ended."""
        definition = self.registry.get(after.name, after.version)
        key = definition.concurrency
        if key is None or not ended(before, after):
            return
        claim = key.claim(definition.decode_data(bytes(after.data)))
        line = self.lines.get((after.context, key.name, claim.value))
        if line is None:
            return
        line.release(ref_of(after.partition, after.id))
        for ref, timers in line.fill(key.limit, self.clock.now_ms()):
            for timer in timers:
                wake(after.context, ref, timer)
