"""Every configuration refuses a bad value at construction, with a message naming it."""

from __future__ import annotations

from typing import Any

import pytest

from bus import BusConfig, ClientConfig
from saga import EngineConfig


@pytest.mark.parametrize(
    ("config", "options", "message"),
    [
        (ClientConfig, {"max_connections": 1}, "max_connections must be at least 2"),
        (ClientConfig, {"socket_timeout_s": 0}, "timeouts must be positive"),
        (ClientConfig, {"connect_timeout_s": -1}, "timeouts must be positive"),
        (ClientConfig, {"retries": -1}, "retries must be zero or more"),
        (BusConfig, {"concurrency": 0}, "BusConfig.concurrency must be positive, got 0"),
        (BusConfig, {"epoch_check_ms": 0}, "BusConfig.epoch_check_ms must be positive"),
        (BusConfig, {"lease_ms": 1000, "heartbeat_ms": 600}, "at most half of lease_ms"),
        (BusConfig, {"on_eviction": "panic"}, "BusConfig.on_eviction must be 'refuse', 'warn' or 'ignore'"),
        (BusConfig, {"on_no_aof": "shrug"}, "BusConfig.on_no_aof must be"),
        (BusConfig, {"replica_acks": -1}, "replica_acks must be >= 0"),
        (BusConfig, {"replica_ack_timeout_ms": 0}, "replica_ack_timeout_ms positive"),
        (BusConfig, {"max_entry_bytes": 10, "max_payload_bytes": 20}, "at least max_payload_bytes"),
        (EngineConfig, {"retention_s": -1}, "retention_s and cache_size must be >= 0"),
        (EngineConfig, {"cache_size": -1}, "retention_s and cache_size must be >= 0"),
        (EngineConfig, {"timer_min_wait_ms": 10, "timer_poll_ms": 5}, "timer_min_wait_ms must be between"),
        (EngineConfig, {"max_conflicts": 0}, "max_conflicts, timer_poll_ms and timer_batch must be positive"),
        (EngineConfig, {"timer_batch": 0}, "timer_batch must be positive"),
        (EngineConfig, {"prune_interval_ms": 0}, "prune_interval_ms must be positive"),
        (EngineConfig, {"stranded_check_ms": 0}, "stranded_check_ms and prune_interval_ms must be positive"),
        (
            EngineConfig,
            {"registration_ttl_ms": 10_000},
            "registration_ttl_ms must be longer than heartbeat_ms",
        ),
        (EngineConfig, {"event_buffer_cap": 0}, "event buffer and schedule settings must be positive"),
        (EngineConfig, {"schedule_recheck_ms": 0}, "event buffer and schedule settings must be positive"),
        (EngineConfig, {"signal_secret": "short"}, "signal_secret must have at least 16 characters"),
    ],
)
def test_a_bad_setting_is_refused_with_its_name(config: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        config(**options)


@pytest.mark.parametrize("config", [ClientConfig, BusConfig, EngineConfig])
def test_the_defaults_are_valid(config: Any) -> None:
    config()
