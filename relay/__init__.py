"""The transactional outbox and inbox, and the relay process (see docs/relay.md)."""
