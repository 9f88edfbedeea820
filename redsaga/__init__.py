"""The redsaga distribution's own namespace.

:mod:`redsaga.ids` and :mod:`redsaga.streams` hold what every layer agrees on -- message
ids, message type names, stream addresses -- with no dependency, so that the bus and the
saga engine's pure core share one definition of each.
"""
