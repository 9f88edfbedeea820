"""Configuration of the saga engine, with defaults and validation in one place."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bus import Authenticator, BusConfig
from bus.lowlevel import is_embedded
from saga.errors import PartitionOutOfRange
from saga.runtime.liveness import health_file_from_env

if TYPE_CHECKING:
    from saga.definition.context import Context


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How orchestrators, timers and workers behave.

    Attributes:
        bus: The transport's settings (leases, retries of deliveries, dead letters, sizes).
        retention_s: An ended saga (and its history) expires this long after it ended;
            export traces you want to keep first (``saga export``). 0 keeps them forever.
        prune_interval_ms: How often a worker forgets ended sagas whose hash expired (their
            status-index entries and counters; ``saga/store/pruning.py``).
        cache_size: Sagas an orchestrator keeps decoded in memory (a cache, checked by
            revision on every commit, so a stale entry costs a retry, never a wrong state).
        max_conflicts: Times an event is re-decided after losing a concurrent update race
            before the entry is left for redelivery.
        timer_poll_ms: Longest wait between two rounds of the timer scheduler (it wakes
            sooner when the next timer is due sooner).
        timer_min_wait_ms: Shortest wait between two rounds: under a steady stream of due
            timers the scheduler fires them in batches this far apart instead of waking for
            each one (firing lag up to about this much, for far less CPU per timer).
        timer_batch: Most timers fired by one script call.
        heartbeat_ms: How often a worker renews its registration of the definition
            versions it serves (``saga/versions/registry.py``).
        registration_ttl_ms: A worker whose registration was not renewed for this long
            counts as gone: the versions only it served are reported stranded.
        stranded_check_ms: How often a worker looks for stranded sagas (versions in flight
            that no live worker serves) and logs them as errors.
        auth: Who this process signs as and what it accepts (``bus.Authenticator``: its
            keyrings and the verification mode; docs/security.md). Default: what
            ``REDSAGA_KEYRING`` and ``REDSAGA_VERIFY`` say, and signing off without them.
        signal_secret: With signing off, the master secret resume tokens are made with
            (never logged). ``None``: the ``REDSAGA_SIGNAL_SECRET`` environment variable,
            else a secret generated once per context and kept in Redis. With signing on,
            tokens are made with the orchestrator's keyring and this is not used.
        token_ttl_s: Resume tokens stop being accepted this long after they were made
            (0: they do not expire; a token for a wait that ended changes nothing anyway).
        event_buffer_s: How long an event nobody waits for yet is kept for a wait that
            registers later (the "event before wait" race).
        event_buffer_cap: Most such events kept per correlation key.
        schedule_poll_ms: How often due schedules are looked for.
        schedule_recheck_ms: How soon a schedule with a buffered occurrence, or waiting for
            a run to end, is looked at again.
        health_file: A file the worker rewrites every ``heartbeat_ms`` while its event loop
            runs and its Redis answers (``saga health worker`` judges its age;
            ``saga/runtime/liveness.py``). Default: ``$REDSAGA_HEALTH_FILE``; ``None``: no file.
        partitions: Serve only these partition indexes of each context (its sagas, inbox,
            timers and the participants' command streams there); several workers divide a
            context's partitions this way (``saga worker --partitions 0-3``). Empty: all.
        unavailable_deadline_s: How long a client call (``SagaClient``, ``TaskClient``, the
            CLI, the demo) keeps retrying while Redis is unavailable (a cluster failover, a
            restart) before it raises ``bus.RedisUnavailable``. The default outlasts a
            failover with a ``cluster-node-timeout`` of 15 s; 0 fails at once.

    """

    bus: BusConfig = field(default_factory=BusConfig)
    retention_s: int = 7 * 86_400
    prune_interval_ms: int = 60_000
    cache_size: int = 10_000
    max_conflicts: int = 20
    timer_poll_ms: int = 50
    timer_min_wait_ms: int = 10
    timer_batch: int = 500
    heartbeat_ms: int = 10_000
    registration_ttl_ms: int = 30_000
    stranded_check_ms: int = 60_000
    auth: Authenticator = field(default_factory=Authenticator.from_env, repr=False)
    signal_secret: str | bytes | None = field(default=None, repr=False)
    token_ttl_s: int = 0
    event_buffer_s: int = 86_400
    event_buffer_cap: int = 16
    schedule_poll_ms: int = 500
    schedule_recheck_ms: int = 1_000
    health_file: str | None = field(default_factory=health_file_from_env)
    partitions: tuple[int, ...] = ()
    unavailable_deadline_s: float = 30.0

    def serves(self, index: int) -> bool:
        """Whether this worker serves partition ``index`` (every one when none are named)."""
        return not self.partitions or index in self.partitions

    def check_signing(self, who: str, redis: object, *, warn: bool = True) -> None:
        """Refuse to run ``who`` on ``redis`` unauthenticated unless signing was turned off on purpose.

        Raises :class:`bus.AuthError` when :attr:`auth` holds no keyring and neither
        ``REDSAGA_VERIFY=off`` nor ``Authenticator(mode="off")`` said so (the rule ``saga worker``
        follows too), except on the embedded in-process Redis (``bus.connect()`` without a
        URL), which no other process can write. A process that runs unauthenticated says so
        at start-up (``warn``: a worker does; a client, used by one-shot commands, does not).
        """
        embedded = is_embedded(redis)  # type: ignore[arg-type]  # any client: only its type is looked at
        self.auth.check_running(who, embedded=embedded, warn=warn)

    def check_partitions(self, contexts: Iterable[Context]) -> None:
        """Refuse partition indexes that none of ``contexts`` (those a worker serves) has.

        Raises :class:`~saga.errors.PartitionOutOfRange` naming them: a worker told to serve
        only partitions that do not exist would start and serve nothing.
        """
        counts = {context.name: context.partitions for context in contexts}
        beyond = tuple(i for i in self.partitions if i >= max(counts.values(), default=0))
        if beyond:
            raise PartitionOutOfRange(beyond, counts)

    def __post_init__(self) -> None:
        if self.retention_s < 0 or self.cache_size < 0:
            raise ValueError("EngineConfig.retention_s and cache_size must be >= 0")
        if not 0 <= self.timer_min_wait_ms <= self.timer_poll_ms:
            raise ValueError("EngineConfig.timer_min_wait_ms must be between 0 and timer_poll_ms")
        if self.max_conflicts < 1 or self.timer_poll_ms <= 0 or self.timer_batch <= 0:
            raise ValueError("EngineConfig.max_conflicts, timer_poll_ms and timer_batch must be positive")
        if self.heartbeat_ms <= 0 or self.stranded_check_ms <= 0 or self.prune_interval_ms <= 0:
            raise ValueError(
                "EngineConfig.heartbeat_ms, stranded_check_ms and prune_interval_ms must be positive"
            )
        if self.registration_ttl_ms <= self.heartbeat_ms:
            raise ValueError("EngineConfig.registration_ttl_ms must be longer than heartbeat_ms")
        if (
            min(self.event_buffer_s, self.event_buffer_cap, self.schedule_poll_ms, self.schedule_recheck_ms)
            <= 0
        ):
            raise ValueError("EngineConfig event buffer and schedule settings must be positive")
        if any(index < 0 for index in self.partitions) or len(set(self.partitions)) != len(self.partitions):
            raise ValueError("EngineConfig.partitions must be distinct indexes >= 0")
        if self.token_ttl_s < 0 or self.unavailable_deadline_s < 0:
            raise ValueError("EngineConfig.token_ttl_s and unavailable_deadline_s must be >= 0")
        if self.signal_secret is not None and len(self.signal_secret) < 16:
            raise ValueError("EngineConfig.signal_secret must have at least 16 characters")
