"""Configuration of the saga engine, with defaults and validation in one place."""

from __future__ import annotations

from dataclasses import dataclass, field

from bus import BusConfig


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How orchestrators, timers and workers behave.

    Attributes:
        bus: The transport's settings (leases, retries of deliveries, dead letters, sizes).
        retention_s: An ended saga (and its history) expires this long after it ended;
            export traces you want to keep first (``saga export``). 0 keeps them forever.
        cache_size: Sagas an orchestrator keeps decoded in memory (a cache, checked by
            revision on every commit, so a stale entry costs a retry, never a wrong state).
        max_conflicts: Times an event is re-decided after losing a concurrent update race
            before the entry is left for redelivery.
        timer_poll_ms: How often each partition's due timers are moved to its inbox.
        timer_batch: Most timers fired by one script call.
        heartbeat_ms: How often a worker renews its registration of the definition
            versions it serves (``saga/_versions.py``).
        registration_ttl_ms: A worker whose registration was not renewed for this long
            counts as gone: the versions only it served are reported stranded.
        stranded_check_ms: How often a worker looks for stranded sagas (versions in flight
            that no live worker serves) and logs them as errors.

    """

    bus: BusConfig = field(default_factory=BusConfig)
    retention_s: int = 7 * 86_400
    cache_size: int = 10_000
    max_conflicts: int = 20
    timer_poll_ms: int = 50
    timer_batch: int = 500
    heartbeat_ms: int = 10_000
    registration_ttl_ms: int = 30_000
    stranded_check_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.retention_s < 0 or self.cache_size < 0:
            raise ValueError("EngineConfig.retention_s and cache_size must be >= 0")
        if self.max_conflicts < 1 or self.timer_poll_ms <= 0 or self.timer_batch <= 0:
            raise ValueError("EngineConfig.max_conflicts, timer_poll_ms and timer_batch must be positive")
        if self.heartbeat_ms <= 0 or self.stranded_check_ms <= 0:
            raise ValueError("EngineConfig.heartbeat_ms and stranded_check_ms must be positive")
        if self.registration_ttl_ms <= self.heartbeat_ms:
            raise ValueError("EngineConfig.registration_ttl_ms must be longer than heartbeat_ms")
