"""The pure core: model, lifecycles, the decider and its rules, redrive, migration, replay.

Given a definition, a saga's state and an event, the decider returns the new state and the
effects to emit. Nothing here touches Redis, a clock or the network, and nothing here
imports :mod:`bus` or ``redis``: a test in ``tests/test_architecture.py`` checks both.
"""
