"""The orchestrator's slot gate: a concurrency key's slot before a saga's first command.

Between deciding and committing a round, the gate asks the line of each saga with a
:class:`~saga.definition.concurrency.Key` that is about to send its first commands (all of
the round's asks in one pipelined batch; each line is one single-slot script under its own
hash tag: ``saga/store/slots.py``). A saga given a slot sends; one that must wait is held
(``saga/core/slot_rules.py``): its transition starts ``slot`` timers due at its next look
at the line. After the round commits, the gate gives back the slots of the sagas that
ended (the next in line are woken: their timers move to now) and looks once more at the
sagas it held, so a slot freed between their ask and their commit is not missed.

What a crash can leave, and who mends it: a slot given back too late (the worker died
between the end's commit and the release) or taken for a start that never committed is
found by the next saga in line at its look: a holder that ended (or that never existed, a
minute after it took the slot) is released then. A lost wake-up costs one ``Key.poll``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from bus import Clock, Envelope, Publisher, uuid7
from bus.lowlevel import Batcher, CommandCall, ScriptCall, get_logger, run_batch
from saga.core.decision import Decision
from saga.core.effects import Dispatch
from saga.core.model import SagaState
from saga.core.rate_rules import held_attempts
from saga.core.slot_rules import ended, gives_up_slot, hold_for_slot, needing_slot, slot_timers
from saga.core.states import SagaStatus
from saga.definition.concurrency import Claim, Key
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.errors import InvalidInput, KeyBusy, SagaError
from saga.runtime.protocol import CANCEL, OperatorRequest
from saga.store.keys import Partition, SlotKeys
from saga.store.slots import (
    BUSY,
    GRANTED,
    REPLACED,
    WAITING,
    Mode,
    SlotReply,
    acquire_call,
    debounce_call,
    look_call,
    parse_ref,
    parse_reply,
    ref_of,
    release_call,
    used_call,
    waiter_call,
    wake_calls,
)
from saga.store.trust import inbox_audience

_log = get_logger("redsaga.saga")
_json = msgspec.json.Encoder()

ORPHAN_GRACE_MS: Final = 60_000
"""How long a slot taken for a saga that does not exist is kept (its start may be committing)."""


@dataclass
class SlotTallies:
    """What the gate did, per key name (the metrics' labels: one per key, never per value)."""

    granted: Counter[str] = field(default_factory=Counter)
    """Sagas that took a slot when they asked (at once or at a later look)."""
    queued: Counter[str] = field(default_factory=Counter)
    """Times a saga was held to wait in line (its first ask and every look that found no slot)."""
    released: Counter[str] = field(default_factory=Counter)
    """Slots (or places in line) given back by sagas that ended."""
    woken: Counter[str] = field(default_factory=Counter)
    """Sagas woken because a slot freed for them."""
    refused: Counter[str] = field(default_factory=Counter)
    """Starts refused (``skip_if_running``) or replaced (``debounce``)."""
    recovered: Counter[str] = field(default_factory=Counter)
    """Slots taken back from holders that had ended or never existed (after a crash)."""


@dataclass(frozen=True, slots=True)
class _Ask:
    """One saga's ask of its line in a round."""

    index: int
    decision: Decision
    key: Key
    keys: SlotKeys
    claim: Claim
    ref: str
    dispatches: list[Dispatch]
    timers: list[str]
    """The ``slot`` timers that hold its commands (what wakes it)."""
    debounce: bool
    looked_before: bool


@dataclass
class Verdicts:
    """What :meth:`SlotGate.gate` decided for a round."""

    held: set[int] = field(default_factory=set)
    """Decisions whose first commands now wait (their transition calls must be built again)."""
    refused: dict[int, SagaError] = field(default_factory=dict)
    """Decisions refused, each with why: a start whose key skips when busy (:class:`KeyBusy`),
    or one whose key cannot be read from its data (:class:`InvalidInput`). The rest of the
    round goes on."""
    waiting: list[_Ask] = field(default_factory=list)
    """The asks held to wait (looked at again once committed: :meth:`SlotGate.settle`)."""
    replaced: list[tuple[str, int, str]] = field(default_factory=list)
    """(context, partition, saga id) of debounced sagas a later start replaced: to cancel."""


class SlotGate:
    """Concurrency keys' slots for one orchestrator's decisions (see the module docstring)."""

    def __init__(
        self,
        redis: Any,
        registry: Registry,
        clock: Clock,
        publisher: Publisher | None,
        batcher: Batcher | None = None,
    ) -> None:
        """``batcher``: a client's, so that concurrent starts ask their lines in one round trip."""
        self.redis = redis
        self.batcher = batcher
        self.registry = registry
        self.clock = clock
        self.publisher = publisher
        self.tallies = SlotTallies()
        self.active = any(d.concurrency is not None for d in registry)
        """Whether any definition has a key (a truth test per round: what a worker without keys pays)."""

    async def _run(self, calls: Sequence[ScriptCall | CommandCall]) -> list[Any]:
        """The calls' replies, in one round trip (shared with concurrent starts through the batcher)."""
        if self.batcher is not None:
            batcher = self.batcher
            results = list(await asyncio.gather(*(batcher.call(call) for call in calls)))
        else:
            results = await run_batch(self.redis, calls)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    def _key_of(self, state: SagaState) -> tuple[Saga[Any], Key] | None:
        definition = self.registry.get(state.name, state.version)
        return None if definition.concurrency is None else (definition, definition.concurrency)

    async def gate(self, decisions: Sequence[tuple[Decision, SagaState | None]]) -> Verdicts:
        """Ask the lines of ``decisions`` (each with the saga before it); hold what must wait.

        A Redis error raises: the round is left for redelivery, as a failed commit would be.
        A key whose value cannot be read from the data raises :class:`~saga.InvalidInput`.
        """
        now = self.clock.script_now_ms()
        verdicts = Verdicts()
        asks: list[_Ask] = []
        calls: list[ScriptCall | CommandCall] = []
        for index, (decision, before) in enumerate(decisions):
            state = decision.state
            found = None if gives_up_slot(state.status) else self._key_of(state)
            dispatches = [] if found is None else needing_slot(before, decision.effects)
            if found is None or not dispatches:
                continue
            definition, key = found
            try:
                claim = key.claim(definition.decode_data(bytes(state.data)))
            except InvalidInput as refused:
                verdicts.refused[index] = refused
                continue
            keys = SlotKeys(state.context, key.name, claim.value)
            ask = _Ask(
                index, decision, key, keys, claim, ref_of(state.partition, state.id), dispatches,
                slot_timers(state, dispatches), debounce=bool(key.debounce_ms) and before is None,
                looked_before=before is not None,
            )  # fmt: skip
            asks.append(ask)
            calls.append(self._ask_call(ask, now))
            calls.append(used_call(state.context, keys, self.clock.now_ms()))
        if not asks:
            return verdicts
        replies = [parse_reply(raw) for raw in (await self._run(calls))[::2]]
        wakes: list[CommandCall] = []
        for ask, reply in zip(asks, replies, strict=True):
            wakes += self._woken(ask.keys, reply)
            self._judge(ask, reply, verdicts)
            if ask.debounce:  # in its window, not yet in line
                continue
            if reply.verdict == WAITING or (reply.verdict == GRANTED and ask.looked_before):
                context = ask.keys.context  # where it waits, for inspect: recorded, or forgotten
                wakes.append(waiter_call(context, ask.keys, ask.ref, waiting=reply.verdict == WAITING))
        if wakes:
            await self._run(wakes)
        return verdicts

    def _ask_call(self, ask: _Ask, now: int) -> ScriptCall:
        if ask.debounce:
            return debounce_call(ask.keys, ask.ref, now_ms=now)
        mode: Mode = "debounced" if ask.key.debounce_ms else "wait"
        if ask.key.skip_if_running and not ask.looked_before:
            mode = "skip"
        return acquire_call(ask.keys, ask.ref, ask.key.limit, ask.claim, ask.timers, now_ms=now, mode=mode)

    def _judge(self, ask: _Ask, reply: SlotReply, verdicts: Verdicts) -> None:
        decision = ask.decision
        name, state = ask.key.name, decision.state
        if ask.debounce:  # the window opens: it takes its place in line when it closes
            due = reply.now_ms + ask.key.debounce_ms
            hold_for_slot(decision, ask.dispatches, due, ask.key.debounce_ms)
            verdicts.held.add(ask.index)
            return
        if reply.verdict == GRANTED:
            self.tallies.granted[name] += 1
            return
        if reply.verdict == BUSY:
            self.tallies.refused[name] += 1
            verdicts.refused[ask.index] = KeyBusy(
                f"saga {state.id} not started: {name} {ask.claim.value!r} has every slot taken "
                f"({ask.key.limit}) and skips when busy",
                key=name,
                value=ask.claim.value,
            )
            return
        if reply.verdict == REPLACED:
            self.tallies.refused[name] += 1
            verdicts.replaced.append((state.context, state.partition, state.id))
        else:
            self.tallies.queued[name] += 1
            verdicts.waiting.append(ask)
            _log.debug("saga waits for a slot", key=name, saga_id=state.id, place=reply.place)
        hold_for_slot(decision, ask.dispatches, reply.now_ms + ask.key.poll_ms, ask.key.poll_ms)
        verdicts.held.add(ask.index)

    def _woken(self, keys: SlotKeys, reply: SlotReply) -> list[CommandCall]:
        self.tallies.woken[keys.name] += len(reply.woken)
        return wake_calls(keys.context, reply.woken, reply.now_ms)

    async def settle(self, verdicts: Verdicts, committed: set[int]) -> None:
        """Look again at the sagas held to wait, cancel the replaced (``committed``: decisions' ids).

        A slot that freed for a saga between its ask and its commit woke a timer that did
        not exist yet; the look wakes it. Holders that ended without giving their slot
        back (a crash) are released here, by the sagas waiting behind them, at each look.
        Errors are logged: the next look mends what this one could not.
        """
        waiting = [a for a in verdicts.waiting if id(a.decision) in committed]
        try:
            if waiting:
                now = self.clock.script_now_ms()
                looks = [look_call(a.keys, a.ref, a.key.limit, now_ms=now) for a in waiting]
                replies = [parse_reply(r) for r in await self._run(looks)]
                await self._after_look(waiting, replies)
            for context, partition, saga_id in verdicts.replaced:
                await self._cancel_replaced(context, partition, saga_id)
        except Exception as error:  # noqa: BLE001 - the next look (Key.poll) mends it
            _log.warning("looking at concurrency lines failed", error=str(error))

    async def _after_look(self, asks: list[_Ask], replies: list[SlotReply]) -> None:
        wakes: list[CommandCall] = []
        for ask, reply in zip(asks, replies, strict=True):
            if reply.verdict == GRANTED:  # a slot freed between its ask and its commit
                self.tallies.woken[ask.key.name] += 1
                wakes += wake_calls(ask.keys.context, [(ask.ref, ask.timers)], reply.now_ms)
            elif ask.looked_before:
                wakes += await self._recover(ask, reply)
        if wakes:
            await self._run(wakes)

    async def _recover(self, ask: _Ask, reply: SlotReply) -> list[CommandCall]:
        """Release holders that ended or never existed; the calls waking whom that served."""
        context = ask.keys.context
        reads = [CommandCall(("HGET", _saga_key(context, ref), "status")) for ref, _ in reply.holders]
        statuses = await self._run(reads) if reads else []
        stale = [
            ref
            for (ref, taken_ms), status in zip(reply.holders, statuses, strict=True)
            if (status is None and reply.now_ms - taken_ms > ORPHAN_GRACE_MS)
            or (status is not None and gives_up_slot(SagaStatus(_text(status))))
        ]
        if not stale:
            return []
        self.tallies.recovered[ask.key.name] += len(stale)
        _log.warning("slots taken back from sagas that ended without them", key=ask.key.name, sagas=stale)
        calls = [release_call(ask.keys, ref, ask.key.limit, now_ms=reply.now_ms) for ref in stale]
        wakes: list[CommandCall] = []
        for raw in await self._run(calls):
            wakes += self._woken(ask.keys, parse_reply(raw))
        return wakes

    async def _cancel_replaced(self, context: str, partition: int, saga_id: str) -> None:
        if self.publisher is None:
            return
        request = OperatorRequest(by="debounce", reason="replaced by a later start with the same key")
        envelope = Envelope(
            id=uuid7(),
            type=CANCEL,
            payload=_json.encode(request),
            source=context,
            correlation_id=saga_id,
            created_at_ms=self.clock.now_ms(),
        )
        inbox = Partition(context, partition).inbox
        await self.publisher.publish_envelope(inbox, envelope, audience=inbox_audience(context))

    async def release(self, changes: Sequence[tuple[SagaState | None, SagaState]]) -> None:
        """Give back the slots of the sagas that ``changes`` (before, after) ended; wake the next.

        Errors are logged: the sagas waiting behind take the slot back at their next look.
        """
        now = self.clock.script_now_ms()
        found: list[tuple[SlotKeys, Key]] = []
        calls: list[ScriptCall] = []
        forget: list[CommandCall] = []
        for before, after in changes:
            key = self._key_of(after) if ended(before, after) else None
            if key is None:
                continue
            definition, concurrency = key
            try:
                claim = concurrency.claim(definition.decode_data(bytes(after.data)))
            except InvalidInput:  # a saga whose key could not be read never took a slot
                continue
            keys, ref = (
                SlotKeys(after.context, concurrency.name, claim.value),
                ref_of(after.partition, after.id),
            )
            found.append((keys, concurrency))
            calls.append(release_call(keys, ref, concurrency.limit, now_ms=now))
            if before is not None and any(held_attempts(before, "slot")):  # it ended in line
                forget.append(waiter_call(after.context, keys, ref, waiting=False))
        if not calls:
            return
        try:
            wakes: list[CommandCall] = []
            for (keys, concurrency), raw in zip(found, await self._run(calls), strict=True):
                self.tallies.released[concurrency.name] += 1
                wakes += self._woken(keys, parse_reply(raw))
            if wakes or forget:
                await self._run([*wakes, *forget])
        except Exception as error:  # noqa: BLE001 - the sagas in line recover the slot
            _log.warning("giving back concurrency slots failed", error=str(error))


def _saga_key(context: str, ref: str) -> str:
    partition, saga_id = parse_ref(ref)
    return Partition(context, partition).saga(saga_id)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
