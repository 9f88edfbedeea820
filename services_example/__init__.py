"""A runnable demo system: orders (orchestrator), payments, inventory and shipping."""
