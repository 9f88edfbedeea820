"""Publishing: one idempotent script call per message (see ``lua/publish.lua``)."""

from __future__ import annotations

from collections.abc import Sequence

from bus._auth import OFF, Authenticator, stream_audience
from bus._client import Redis
from bus._config import BusConfig
from bus._envelope import Envelope, new_envelope
from bus._errors import BusError, PayloadTooLarge
from bus._lua import PUBLISH, PUBLISH_BATCH
from bus._scripts import BatchPart, ScriptCall, acks_of, merge, run_batch
from bus._tracing import with_current
from redsaga.streams import Stream

MAX_BATCH = 100
"""Most messages one publish script call carries (bounds the time Redis spends in it)."""


def publish_call(stream: Stream, envelope: Envelope, config: BusConfig) -> ScriptCall:
    """The script call that publishes ``envelope`` on ``stream`` once per dedupe window."""
    args: list[str | bytes | int] = [
        stream.key,
        envelope.id,
        config.publish_dedupe_window_ms,
        *envelope.field_args(),
    ]
    return PUBLISH.call([stream.published_key], args)


def publish_part(stream: Stream, envelope: Envelope, config: BusConfig) -> BatchPart:
    """One message of a merged ``lua/publish_batch.lua`` call (one stream per call)."""
    return BatchPart(
        PUBLISH_BATCH,
        (stream.published_key,),
        (stream.key, config.publish_dedupe_window_ms),
        (),
        (envelope.id, *envelope.field_args()),
    )


class Publisher:
    """Publishes messages to streams.

    A publish is safe to repeat: the message id is remembered for
    ``BusConfig.publish_dedupe_window_ms``, so a call that redis-py re-sends after a lost
    reply (or a caller's own retry with the same ``message_id``) adds one entry only.
    Nothing is ever trimmed on publish (see ``docs/bus.md``, retention).

    With signing on (``auth``), every envelope not signed yet is signed by ``principal``
    (or the ``signer`` a call names) for its audience: the one a call names, else the
    stream's own (``stream:<key>``, a broadcast stream). Signed envelopes (outbox rows,
    requeued dead letters) are published as they are.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        source: str = "",
        config: BusConfig | None = None,
        auth: Authenticator = OFF,
        principal: str = "",
    ) -> None:
        self._redis = redis
        self._source = source
        self._config = config or BusConfig()
        self.auth = auth
        self.principal = principal

    async def publish(
        self,
        stream: str | Stream,
        message: object,
        *,
        correlation_id: str = "",
        causation_id: str = "",
        idempotency_key: str = "",
        reply_to: Stream | None = None,
        headers: dict[str, str] | None = None,
        message_id: str | None = None,
        audience: str | None = None,
        signer: str | None = None,
    ) -> str | None:
        """Publish ``message``; return its entry id, or ``None`` if the id was published already.

        Raises :class:`~bus.PayloadTooLarge` before writing anything when the encoded
        message is over the limit. With tracing on, the headers carry the current span's
        trace context (unless ``headers`` name one already; ``bus/_tracing.py``).
        """
        envelope = new_envelope(
            message,
            max_bytes=self._config.max_payload_bytes,
            source=self._source,
            correlation_id=correlation_id,
            causation_id=causation_id,
            idempotency_key=idempotency_key,
            reply_to=reply_to.key if reply_to else "",
            headers=with_current(headers),
            message_id=message_id,
        )
        return await self.publish_envelope(stream, envelope, audience=audience, signer=signer)

    async def publish_envelope(
        self,
        stream: str | Stream,
        envelope: Envelope,
        *,
        audience: str | None = None,
        signer: str | None = None,
    ) -> str | None:
        """Publish a ready-made envelope (its id decides deduplication).

        Raises :class:`~bus.PayloadTooLarge` before writing anything when its payload is
        over the limit.
        """
        self._check_size(envelope)
        target = stream if isinstance(stream, Stream) else Stream.named(stream)
        call = publish_call(target, self.signed(target, envelope, audience, signer), self._config)
        acks = acks_of(self._config)
        if acks is None:
            return _entry_id(await call.run(self._redis))
        (reply,) = await run_batch(self._redis, [call], acks=acks)
        if isinstance(reply, BusError):
            raise reply
        return _entry_id(reply)

    async def publish_many(
        self, items: Sequence[tuple[Stream, Envelope]], *, audience: str | None = None
    ) -> list[str | None]:
        """Publish several envelopes in one round trip; raise the first error.

        Consecutive envelopes for one stream share one script call (at most
        ``MAX_BATCH`` each), each deduplicated by its id as :meth:`publish_envelope` does.
        Returns each envelope's entry id, ``None`` for one already published.
        """
        for _, envelope in items:
            self._check_size(envelope)
        items = [(stream, self.signed(stream, envelope, audience, None)) for stream, envelope in items]
        calls: list[ScriptCall] = []
        sizes: list[int] = []
        start = 0
        while start < len(items):
            stream = items[start][0]
            end = start + 1
            while end < len(items) and end - start < MAX_BATCH and items[end][0] == stream:
                end += 1
            calls.append(merge([publish_part(stream, e, self._config) for _, e in items[start:end]]))
            sizes.append(end - start)
            start = end
        replies = await run_batch(self._redis, calls, acks=acks_of(self._config))
        entry_ids: list[str | None] = []
        for reply, size in zip(replies, sizes, strict=True):
            if isinstance(reply, BusError):
                raise reply
            entry_ids += [_entry_id(result) for result in reply[:size]]
        return entry_ids

    def signed(
        self, stream: Stream, envelope: Envelope, audience: str | None, signer: str | None
    ) -> Envelope:
        """``envelope`` as it is published on ``stream``: signed unless signing is off or it is already."""
        if not self.auth.enabled or envelope.mac:
            return envelope
        return self.auth.sign(envelope, audience or stream_audience(stream.key), signer or self.principal)

    def _check_size(self, envelope: Envelope) -> None:
        # Envelopes built elsewhere (signals, operator requests) skip new_envelope's check.
        if len(envelope.payload) > self._config.max_payload_bytes:
            raise PayloadTooLarge(len(envelope.payload), self._config.max_payload_bytes)


def _entry_id(result: object) -> str | None:
    return result.decode() if isinstance(result, bytes) else None
