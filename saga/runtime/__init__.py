"""The runtime: orchestrators, participants, the client, children, schedules and timers.

The processes that move sagas: they read streams, call the pure core and commit through
the store.
"""
