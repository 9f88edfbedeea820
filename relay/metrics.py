"""Prometheus metrics and readiness of a relay: ``saga relay --metrics-port``, or a host's registry.

``redsaga_outbox_backlog``, ``redsaga_outbox_oldest_unsent_seconds`` and
``redsaga_outbox_failed`` are read from the outbox database at scrape time; the rows the relay
sent and the outages it met are its counters. See ``relay/_metrics.py`` and
``docs/operations.md``.
"""

from relay._metrics import RELAY_METRICS, OutboxMetrics, RelayMetrics

__all__ = ["RELAY_METRICS", "OutboxMetrics", "RelayMetrics"]
