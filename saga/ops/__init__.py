"""Operations: the admin client, inspection, listing, stats, traces, diagrams, ACLs, keys.

What the ``saga`` command line calls, built on the runtime and the store.
"""
