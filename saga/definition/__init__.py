"""Declaring sagas: steps, compensations, groups, waits, retry policies, schedules, shapes.

What a user writes, checked when it is written. Pure: nothing here reads Redis, a clock or
the network, so the decider (:mod:`saga.core`) can interpret definitions without the
transport. See docs/architecture.md for what each layer may import.
"""
