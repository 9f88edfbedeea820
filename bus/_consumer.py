"""One consumer group on one stream: read, decode, dedupe, run handlers, complete or fail.

Every entry read ends in exactly one of: acknowledged after its handler succeeded (with its
reply and dedupe record, in one script), scheduled for redelivery, moved to the dead-letter
stream with its context (atomically with the ack), or left pending for the reclaimer when
this worker loses its lease or stops. Nothing is dropped, and bad input never raises out of
here. Reading entries and deciding whether each can be handled at all is the group's
:class:`~bus._intake.Intake` (``bus/_intake.py``); this module runs and ends them.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from bus._app import BatchHandler, Route, Subscription
from bus._auth import OFF, Authenticator
from bus._client import Redis
from bus._clock import Clock
from bus._completer import Completer
from bus._config import BusConfig
from bus._crash import AFTER_SIDE_EFFECT, crash_point
from bus._delivery import Delivery, LeaseLost
from bus._envelope import Envelope
from bus._errors import (
    AuthError,
    BusError,
    GroupExists,
    GroupMissing,
    MalformedEntry,
    PayloadTooLarge,
    PermanentError,
    StreamDeleted,
    Unauthenticated,
    redis_errors,
)
from bus._intake import Claim, Entry, Intake, Refused
from bus._log import Logger, get_logger
from bus._outcomes import (
    RESULT_PREFIX,
    Reply,
    ack_call,
    claim_refused,
    complete_part,
    dead_letter_call,
    encode_result,
    error_chain,
    fail_call,
    heartbeat_call,
    record_call,
    reply_envelope,
    reply_key_stream,
)
from bus._pool import HandlerPool
from bus._publisher import Publisher, publish_call
from bus._scripts import BatchPart, ScriptCall
from bus._slots import Slots
from bus._tally import Buckets
from redsaga.streams import Stream

_log = get_logger("redsaga.bus")
_PERMANENT = (PermanentError, MalformedEntry, PayloadTooLarge, Unauthenticated)
GROUP_RECREATED = "group_recreated"
LEASE_LOST = "lease_lost"
LETTERS_OVER_QUOTA = "letters_over_quota"
"""Dead letters counted, not kept: their principal was past ``BusConfig.letter_quota``."""
UNVERIFIED = "unverified"
"""Whose letters entries refused before their signature was checked count against."""


@dataclass(slots=True)
class Runtime:
    """What every consumer of one worker shares."""

    redis: Redis
    config: BusConfig
    clock: Clock
    consumer: str
    source: str
    slots: Slots
    completer: Completer
    publisher: Publisher
    auth: Authenticator = OFF
    read_share: int = 1
    rng: random.Random = field(default_factory=random.Random)
    incidents: Counter[str] = field(default_factory=Counter)
    """Operator faults met and repaired (see :attr:`bus.Worker.incidents`)."""


class GroupConsumer:
    """Reads and handles the entries of one :class:`~bus._app.Subscription`."""

    def __init__(self, runtime: Runtime, subscription: Subscription) -> None:
        self.rt = runtime
        self.sub = subscription
        # Entries this worker holds: a running handler's Delivery, or None while the call
        # that ends the entry (ack, dead letter) is on its way.
        self.inflight: dict[str, Delivery | None] = {}
        # Entries delivered to this worker again while its earlier delivery still runs (a
        # group recreated from 0, our own reclaim): each keeps its slot until that one ends.
        self._parked: dict[str, tuple[HandlerPool, Entry]] = {}
        self.delivered = 0
        """Entries read or taken over so far (metrics: ``bus/_metrics.py``)."""
        self.redelivered = 0
        """Of those, entries taken over after their lease expired."""
        self.queue_wait: Buckets | None = None
        """How long the entries read had waited in the stream (set when metrics are installed)."""
        self.log = _log.bind(stream=subscription.stream.key, group=subscription.group)
        self.intake = Intake(runtime, subscription, self.log)
        """Reads the group's entries and admits or refuses each."""

    @property
    def stream(self) -> Stream:
        """The stream this consumer reads."""
        return self.sub.stream

    async def ensure_group(self, start_id: str | None = None) -> None:
        """Create the consumer group (and the stream) unless it exists."""
        try:
            with redis_errors():
                await self.rt.redis.xgroup_create(
                    self.stream.key,
                    self.sub.group,
                    id=start_id or self.sub.start_id,
                    mkstream=True,
                )
        except GroupExists:
            return

    async def recreate_group(self, error: GroupMissing) -> None:
        """Report a group (or its stream) that vanished under this worker and create it again.

        It is recreated from ``0``, not ``$``: entries added between the loss and now (and
        every entry still in the stream) are delivered again rather than skipped, so
        nothing is dropped silently; handlers are idempotent, so the re-delivery of entries
        handled before is harmless. What was pending in the old group is re-delivered too.
        """
        self.log.error(
            "stream deleted (by an operator?); recreating the group from 0"
            if isinstance(error, StreamDeleted)
            else "consumer group vanished (by an operator?); recreating it from 0",
            error=str(error),
            incident=GROUP_RECREATED,
        )
        self.rt.incidents[GROUP_RECREATED] += 1
        await self.ensure_group("0")

    async def read(self, handlers: HandlerPool, block_ms: int | None) -> int:
        """Read new entries (as many as there are free slots) and start handling them.

        A read takes at most ``read_share`` slots and holds them while it blocks; slots are
        granted in arrival order, so the reclaimer and other readers are served while this
        read waits (see ``bus/_slots.py``).
        """
        wanted = await self.rt.slots.reserve(self.rt.read_share)
        claims: dict[str, Claim] = {}  # an idempotent group's keys are claimed as it reads
        try:
            with redis_errors():
                if self.sub.idempotent:
                    entries, claims = await self.intake.read_claimed(wanted, block_ms)
                else:
                    entries = await self.intake.read_new(wanted, block_ms)
        except BaseException:
            self.rt.slots.release(wanted)
            raise
        self.rt.slots.release(wanted - len(entries))
        self.delivered += len(entries)
        if self.queue_wait is not None and entries:
            now_ms = self.rt.clock.now_ms()
            for entry_id, _, _ in entries:  # an id's first part: when Redis added the entry
                self.queue_wait.observe(max(0, now_ms - int(entry_id.partition("-")[0])) / 1000)
        await self._process(handlers, entries, claims)
        return len(entries)

    async def reclaim(self, handlers: HandlerPool) -> int:
        """Take over entries whose lease expired (XAUTOCLAIM) and handle them."""
        cursor, total = "0-0", 0
        while True:
            wanted = await self.rt.slots.reserve(self.rt.read_share)
            try:
                cursor, entries, deleted = await self.intake.claim_expired(
                    cursor, wanted, among=len(self.inflight)
                )
            except BaseException:
                self.rt.slots.release(wanted)
                raise
            self.rt.slots.release(wanted - len(entries))
            for entry_id in deleted:
                await self.intake.report_lost(entry_id)
            self.delivered += len(entries)
            self.redelivered += len(entries)
            await self._process(handlers, entries)
            total += len(entries)
            if cursor == "0-0":
                return total

    async def heartbeat(self, deliveries: list[Delivery]) -> list[Delivery]:
        """Extend the leases of ``deliveries``; cancel and return those whose lease was lost."""
        flags = await heartbeat_call(deliveries, self.rt.config.lease_ms).run(self.rt.redis)
        now = self.rt.clock.now_ms()
        lost = []
        for delivery, held in zip(deliveries, flags, strict=True):
            if held:
                delivery.last_beat_ms = now
            else:
                lost.append(delivery)
                delivery.scope.cancel()
        for delivery in lost:
            self.rt.incidents[LEASE_LOST] += 1
            self.log.warning(
                "lease lost; abandoning the handler", entry=delivery.entry_id, incident=LEASE_LOST
            )
        return lost

    def abandon_unbeaten(self, cutoff_ms: int) -> None:
        """Cancel handlers whose last heartbeat that got through is older than ``cutoff_ms``.

        Their lease may expire at any moment and another consumer take the entry over, so
        they stop here rather than run (and apply effects) side by side with it; the entry
        stays pending and nothing is completed for it.
        """
        for delivery in self.inflight.values():
            if delivery and delivery.last_beat_ms < cutoff_ms and not delivery.scope.cancel_called:
                delivery.scope.cancel()
                self.log.warning(
                    "no heartbeat got through for most of the lease; abandoning the handler",
                    entry=delivery.entry_id,
                )

    async def _beat_one(self, delivery: Delivery) -> bool:
        return not await self.heartbeat([delivery])

    async def _process(
        self, handlers: HandlerPool, entries: list[Entry], claims: dict[str, Claim] | None = None
    ) -> None:
        claims = claims or {}  # the dedupe claims made as they were read (the others' are made here)
        ready: list[tuple[Delivery, Route, Any]] = []
        for entry_id, fields, deliveries in entries:
            if entry_id in self.inflight:  # our own handler still runs it: not a second copy now
                if entry_id in self._parked:
                    self.rt.slots.release()
                self._parked[entry_id] = (handlers, (entry_id, fields, deliveries))
                continue
            claim = claims.get(entry_id)
            admitted = self.intake.admit(entry_id, fields, deliveries, self._beat_one, claim)
            if isinstance(admitted, Refused):
                self._refuse(entry_id, admitted)
            else:
                ready.append(admitted)
        try:
            verdicts = await self.intake.verdicts(ready, claims)
        except BusError:
            # Unclaimed entries stay pending under this consumer; the reclaimer retries them.
            self.rt.slots.release(len(ready))
            raise
        batches: dict[Route, list[tuple[Any, Delivery]]] = {}
        for delivery, route, message in ready:
            verdict = verdicts.get(delivery.entry_id)
            self.inflight[delivery.entry_id] = delivery
            delivery.last_beat_ms = self.rt.clock.now_ms()
            if verdict is None and route.batch:
                batches.setdefault(route, []).append((message, delivery))
            elif verdict is None:
                handlers.start(self._run, delivery, route, message)
            elif verdict.startswith(RESULT_PREFIX):
                self._complete(delivery, verdict)
            else:  # in flight elsewhere, or no room among the group's dedupe records (yet)
                self._fail(delivery, claim_refused(verdict, self.rt.config, self.rt.incidents), dead=False)
        for route, batch in batches.items():
            handlers.start(self._run_batch, route, batch)

    def _refuse(self, entry_id: str, refused: Refused) -> None:
        """Dead-letter an entry that cannot be handled, or acknowledge one the group skips."""
        if refused.dead:
            self._dead(entry_id, refused.reason, refused.envelope, refused.dedupe_key)
        else:
            call = ack_call(
                self.stream, self.sub.group, self.rt.consumer, [entry_id], dedupe_key=refused.dedupe_key
            )
            self._settle(entry_id, call, "skipped")

    async def _run(self, delivery: Delivery, route: Route, message: Any) -> None:
        with delivery.scope as scope:
            if not scope.cancel_called:  # else the lease was lost before the handler started
                try:
                    reply = await route.handler(message, delivery)
                    result = encode_result(reply, self.rt.config)
                    remember = not isinstance(reply, Reply) or reply.remember
                except LeaseLost:
                    scope.cancel()
                except Exception as error:  # noqa: BLE001 - classified in _failed
                    self._failed(delivery, error)
                    return
                else:
                    self._handled(delivery, result, remember=remember)
                    return
        self._abandoned(delivery)

    async def _run_batch(self, route: Route, batch: list[tuple[Any, Delivery]]) -> None:
        """Run a batch route's handler once for ``batch``; end each entry by its outcome."""
        handler = cast(BatchHandler, route.handler)
        try:
            outcomes = list(await handler(batch))
        except Exception as error:  # noqa: BLE001 - a bug in the handler fails every entry
            outcomes = [error] * len(batch)
        if len(outcomes) != len(batch):
            bug = RuntimeError(f"{route.name} returned {len(outcomes)} outcomes for {len(batch)} entries")
            outcomes = [bug] * len(batch)
        for (_, delivery), outcome in zip(batch, outcomes, strict=True):
            if outcome is None:
                self._handled(delivery, encode_result(None, self.rt.config))
            elif isinstance(outcome, LeaseLost):
                self._abandoned(delivery)
            else:
                self._failed(delivery, outcome)

    def _handled(self, delivery: Delivery, result: bytes, *, remember: bool = True) -> None:
        if delivery.acked_by_handler:
            self._settled(delivery.entry_id, b"done", "completed by the handler")
        else:
            crash_point(AFTER_SIDE_EFFECT)
            self._complete(delivery, result, remember=remember)

    def _failed(self, delivery: Delivery, error: BaseException) -> None:
        if isinstance(error, _PERMANENT):
            self._log_for(delivery).warning("handler failed permanently", error=error_chain(error))
            self._fail(delivery, error_chain(error), dead=True)
        else:  # any other failure is transient by contract
            self._log_for(delivery).info("handler failed; will retry", error=error_chain(error))
            self._fail(delivery, error_chain(error), dead=False)

    def _abandoned(self, delivery: Delivery) -> None:
        self._log_for(delivery).warning("handler abandoned; the entry stays pending for another consumer")
        self._settled(delivery.entry_id, None, "abandoned")

    def _log_for(self, delivery: Delivery) -> Logger:
        """A logger bound to ``delivery`` (bound only when there is something to say)."""
        envelope = delivery.envelope
        return self.log.bind(
            entry=delivery.entry_id,
            type=envelope.type,
            saga_id=envelope.correlation_id,  # the saga's id, for a saga's command or reply
            step=envelope.headers.get("step", ""),
            attempt=envelope.attempt,
            delivery=delivery.deliveries,
        )

    def _complete(self, delivery: Delivery, result: bytes, *, remember: bool = True) -> None:
        reply = reply_envelope(
            delivery.envelope,
            result,
            source=self.rt.source,
            consumer=self.rt.consumer,
            now_ms=self.rt.clock.now_ms(),
        )
        if reply is not None and delivery.principal:  # to whoever signed the command
            try:
                reply = self.rt.auth.sign(reply, delivery.principal, self.sub.principal)
            except AuthError as error:  # a keyring issued for another topology
                if self.rt.auth.mode == "require":
                    self._failed(delivery, error)
                    return
                self._log_for(delivery).warning(
                    "reply sent unsigned (verification mode 'log')", error=str(error)
                )
        target = reply_key_stream(delivery.envelope)
        across = reply is not None and target is not None and not target.same_slot(self.stream)
        # Across slots the reply cannot share the script: record the result first, then
        # publish, then ack. A crash in between is safe: the redelivery finds the recorded
        # result and replies with it, and the reply's derived id dedupes the publish.
        # Otherwise the completion is one part of a merged call (one script per flush),
        # which publishes the reply only as it acknowledges the entry it owns: no dedupe.
        call: ScriptCall | BatchPart = (
            record_call(delivery, result, self.rt.config, remember=remember)
            if across
            else complete_part(delivery, result, reply, self.rt.config, remember=remember)
        )

        def done(outcome: Any) -> None:
            if isinstance(outcome, list):  # ['duplicate', first result]: reply with the first
                self._complete(delivery, outcome[1])
            elif across and outcome == b"done" and reply is not None and target is not None:
                self.rt.completer.submit(
                    publish_call(target, reply, self.rt.config),
                    lambda _: self._settle(delivery.entry_id, self._ack_call(delivery.entry_id), "completed"),
                )
            else:
                self._settled(delivery.entry_id, outcome, "completed")

        self.rt.completer.submit(call, done)

    def _fail(self, delivery: Delivery, error: str, *, dead: bool) -> None:
        config = self.rt.config
        delay = int(config.retry_delay_ms(delivery.deliveries) * self.rt.rng.uniform(0.5, 1.0))
        call = fail_call(
            delivery,
            dead=dead,
            error=error,
            reason=f"permanent failure: {error}",
            delay_ms=delay,
            config=config,
            quota=(delivery.principal or UNVERIFIED) if self.sub.bounded_letters else "",
        )
        self._settle(delivery.entry_id, call, "failure recorded")

    def _dead(
        self, entry_id: str, reason: str, envelope: Envelope | None = None, dedupe_key: bytes | None = None
    ) -> None:
        self.log.warning("dead-lettering entry", entry=entry_id, reason=reason)
        call = dead_letter_call(
            self.stream,
            self.sub.group,
            self.rt.consumer,
            entry_id,
            dead=True,
            error=reason,
            reason=reason,
            config=self.rt.config,
            dedupe_key=dedupe_key,
            envelope=envelope,
            quota=UNVERIFIED if self.sub.bounded_letters else "",
        )
        self.inflight[entry_id] = None
        self._settle(entry_id, call, "dead-lettered")

    def _ack_call(self, entry_id: str) -> ScriptCall:
        return ack_call(self.stream, self.sub.group, self.rt.consumer, [entry_id])

    def _settle(self, entry_id: str, call: ScriptCall, what: str) -> None:
        """Send the call that ends this delivery, then free its slot."""
        self.inflight.setdefault(entry_id, None)
        self.rt.completer.submit(call, lambda outcome: self._settled(entry_id, outcome, what))

    def _settled(self, entry_id: str, outcome: Any, what: str) -> None:
        if outcome in (b"lost", [0]):
            self.log.warning("outcome refused: the lease was taken over", outcome=what, entry=entry_id)
        elif outcome == b"over":  # a log line per quota's worth of them, not per entry
            self.rt.incidents[LETTERS_OVER_QUOTA] += 1
            if (over := self.rt.incidents[LETTERS_OVER_QUOTA]) % self.rt.config.letter_quota in (0, 1):
                self.log.warning("dead letters over their principal's quota: counted, not kept", count=over)
        elif isinstance(outcome, GroupMissing):
            self.log.error(
                "outcome not recorded: the group vanished; the entry is delivered again once "
                "the group is recreated",
                outcome=what,
                entry=entry_id,
            )
        elif isinstance(outcome, Exception):
            self.log.error(
                "outcome not recorded; the entry stays pending",
                outcome=what,
                entry=entry_id,
                error=str(outcome),
            )
        if entry_id in self.inflight:
            del self.inflight[entry_id]
            self.rt.slots.release()
        parked = self._parked.pop(entry_id, None)
        if parked is None:
            return
        handlers, entry = parked
        if outcome != b"retry" and not handlers.closed:
            handlers.start(self._handle_parked, handlers, entry)
        else:  # a retry is scheduled (it comes with the lease), or the worker is stopping
            self.rt.slots.release()

    async def _handle_parked(self, handlers: HandlerPool, entry: Entry) -> None:
        """Handle a re-delivery whose earlier delivery has ended, if the entry is still ours.

        Whatever that delivery's outcome, it may not cover this one: an acknowledgement sent
        to a group that was then destroyed and recreated leaves the new group's entry
        pending, and an abandoned handler leaves it pending too. Waiting for its lease to
        expire would stall its saga for a lease; an entry no longer pending is left alone.
        """
        entry_id, fields, _ = entry
        try:
            pending = await self.intake.delivery_counts([entry_id])
        except BusError as error:
            pending = {}
            self.log.warning(
                "re-delivered entry not checked; it stays pending", entry=entry_id, error=str(error)
            )
        if entry_id not in pending:
            self.rt.slots.release()
            return
        try:
            await self._process(handlers, [(entry_id, fields, pending[entry_id])])
        except BusError as error:  # its dedupe claim failed (_process gave the slot back)
            self.log.warning(
                "re-delivered entry not handled; it stays pending", entry=entry_id, error=str(error)
            )
