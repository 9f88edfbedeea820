"""Configuration of the Redis client and of the bus, with defaults and validation in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How redsaga connects to Redis.

    Attributes:
        socket_timeout_s: Longest wait for any reply; must exceed the longest blocking read.
        connect_timeout_s: Longest wait for a TCP connection.
        health_check_interval_s: Idle connections are pinged after this long before reuse,
            so a half-open link is found before a command is lost on it.
        retries: How often redis-py re-sends a command after a connection error. Every
            redsaga write is idempotent, so a re-sent command that already ran changes nothing.
        client_name: ``CLIENT SETNAME`` value, shown by ``CLIENT LIST``.
        max_connections: Connections in the pool; callers beyond it wait for one to be
            free (up to ``socket_timeout_s``) instead of failing. Blocking reads each hold one.

    """

    socket_timeout_s: float = 5.0
    connect_timeout_s: float = 2.0
    health_check_interval_s: int = 10
    retries: int = 3
    client_name: str = "redsaga"
    max_connections: int = 64

    def __post_init__(self) -> None:
        if self.max_connections < 2:
            raise ValueError("max_connections must be at least 2 (a blocking read holds one)")
        if self.socket_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValueError("socket and connect timeouts must be positive")
        if self.retries < 0:
            raise ValueError("retries must be zero or more")


@dataclass(frozen=True, slots=True)
class BusConfig:
    """How consumers read, lease, retry and dead-letter, and how big a message may be.

    Attributes:
        concurrency: Handler slots per worker; a reader asks Redis for at most as many
            entries as there are free slots (backpressure). A blocking reader holds up to
            ``concurrency / readers`` of them, so a worker reading many streams needs more
            (at 64, a worker running the demo's orchestrator and three participants read
            ~10 entries at a time and did 22% fewer sagas a second than at 256; see
            docs/performance.md). Memory peaks near ``concurrency * max_entry_bytes``.
        read_batch: Upper bound on entries per XREADGROUP call.
        block_ms: How long a read waits for new entries; below the client's socket timeout.
        lease_ms: An entry idle this long (no heartbeat) is taken over by another consumer.
        heartbeat_ms: How often in-flight entries are heartbeated (default a third of the
            lease; at most half of it). A handler whose last heartbeat that got through is
            older than :attr:`give_up_ms` is cancelled (its lease may expire any moment).
        reclaim_interval_ms: How often a worker looks for entries whose lease expired.
        max_deliveries: Deliveries after which a failing entry is dead-lettered.
        retry_base_ms: First redelivery delay after a transient failure; doubles per delivery.
        retry_max_ms: Longest redelivery delay, capped at the lease since redelivery rides
            on lease expiry (see docs/bus.md).
        dedupe_ttl_s: How long an idempotent handler's first result is kept.
        dedupe_quota: The most dedupe records (in-flight markers and first results) one
            consumer group keeps per stream tag: per partition and participant for a saga's
            commands. A delivery whose key would be one more waits (it is retried, and
            dead-lettered at ``max_deliveries``) until records expire, and counts as a
            ``dedupe_over_quota`` incident. Size it at the peak deliveries per second of one
            partition times ``dedupe_ttl_s``.
        publish_dedupe_window_ms: How long a published message id is remembered, so that a
            re-sent publish does not add a second entry.
        max_payload_bytes: Largest message payload accepted by publish.
        max_entry_bytes: Largest stream entry a consumer decodes; bigger ones are dead-lettered.
        max_fields: Most fields a stream entry may have before it is dead-lettered.
        dlq_field_cap_bytes: Each raw field copied into a dead letter is cut to this size.
        shutdown_grace_s: How long a stopping worker lets in-flight handlers finish.
        retention_ms: Acknowledged entries older than this are trimmed (entries that any
            group has not acknowledged are never trimmed); ``None`` keeps everything.
        maintenance_interval_ms: How often trimming and consumer clean-up run.
        consumer_idle_ms: A consumer idle this long with nothing pending is deleted.
        on_eviction: What a worker does at start when Redis may evict keys
            (``maxmemory-policy`` not ``noeviction``): ``refuse`` (raise
            :class:`~bus.UnsafeRedisConfig`), ``warn`` (log an error) or ``ignore``.
        on_no_aof: The same, when Redis runs without AOF (``appendonly no``); default ``warn``.
        replica_acks: Producers (``SagaClient`` starts, ``Publisher``) wait, in the same
            pipeline, until this many replicas acknowledged their writes (``WAIT``), and
            raise :class:`~bus.ReplicaAckTimeout` when fewer did in time. 0: no wait.
        replica_ack_timeout_ms: The longest such wait.
        epoch_check_ms: How often a running worker checks that Redis still holds its data
            (the ``rs:epoch`` key, see ``bus/_epoch.py``); it also checks before recreating
            a vanished consumer group. ``None`` turns the check off.
        letter_quota: On a stream that many principals write (a saga inbox), the most
            dead letters kept per principal (the checked signer; ``unverified`` for entries
            refused before a signature was checked) in each ``letter_window_ms``; past it,
            one letter says so and the rest are counted, not kept (``lua/fail.lua``).
        letter_window_ms: The window of ``letter_quota``.

    """

    concurrency: int = 256
    read_batch: int = 100
    block_ms: int = 1000
    lease_ms: int = 30_000
    heartbeat_ms: int | None = None
    reclaim_interval_ms: int = 5_000
    max_deliveries: int = 5
    retry_base_ms: int = 1_000
    retry_max_ms: int = 30_000
    dedupe_ttl_s: int = 86_400
    dedupe_quota: int = 10_000_000
    publish_dedupe_window_ms: int = 300_000
    max_payload_bytes: int = 1 << 20
    max_entry_bytes: int = (1 << 20) + (64 << 10)
    max_fields: int = 32
    dlq_field_cap_bytes: int = 64 << 10
    shutdown_grace_s: float = 10.0
    retention_ms: int | None = 7 * 86_400_000
    maintenance_interval_ms: int = 60_000
    consumer_idle_ms: int = 3_600_000
    on_eviction: Literal["refuse", "warn", "ignore"] = "refuse"
    on_no_aof: Literal["refuse", "warn", "ignore"] = "warn"
    replica_acks: int = 0
    replica_ack_timeout_ms: int = 1_000
    epoch_check_ms: int | None = 5_000
    letter_quota: int = 1_000
    letter_window_ms: int = 60_000

    def __post_init__(self) -> None:
        positive = {
            "concurrency": self.concurrency,
            "read_batch": self.read_batch,
            "block_ms": self.block_ms,
            "lease_ms": self.lease_ms,
            "reclaim_interval_ms": self.reclaim_interval_ms,
            "max_deliveries": self.max_deliveries,
            "max_payload_bytes": self.max_payload_bytes,
            "max_fields": self.max_fields,
            "epoch_check_ms": 1 if self.epoch_check_ms is None else self.epoch_check_ms,
            "letter_quota": self.letter_quota,
            "dedupe_quota": self.dedupe_quota,
            "letter_window_ms": self.letter_window_ms,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"BusConfig.{name} must be positive, got {value}")
        if self.effective_heartbeat_ms * 2 > self.lease_ms:
            raise ValueError(
                "BusConfig.heartbeat_ms must be at most half of lease_ms, so that a missed "
                "heartbeat can be retried before the lease expires"
            )
        for name, mode in (("on_eviction", self.on_eviction), ("on_no_aof", self.on_no_aof)):
            if mode not in ("refuse", "warn", "ignore"):
                raise ValueError(f"BusConfig.{name} must be 'refuse', 'warn' or 'ignore', got {mode!r}")
        if self.replica_acks < 0 or self.replica_ack_timeout_ms <= 0:
            raise ValueError("BusConfig.replica_acks must be >= 0 and replica_ack_timeout_ms positive")
        if self.max_entry_bytes < self.max_payload_bytes:
            raise ValueError("BusConfig.max_entry_bytes must be at least max_payload_bytes")

    @property
    def effective_heartbeat_ms(self) -> int:
        """The heartbeat period: as configured, else a third of the lease."""
        return self.heartbeat_ms or self.lease_ms // 3

    @property
    def give_up_ms(self) -> int:
        """Age of the last heartbeat that got through at which a worker abandons a handler.

        80% of the lease, checked every tenth of it: the handler stops before the lease
        expires and another consumer may take the entry over.
        """
        return self.lease_ms - self.lease_ms // 5

    def retry_delay_ms(self, deliveries: int) -> int:
        """Delay before redelivery after ``deliveries`` failed deliveries (exponential, capped)."""
        cap = min(self.retry_max_ms, self.lease_ms)
        return int(min(cap, self.retry_base_ms * 2 ** max(0, deliveries - 1)))
