"""The saga store: the only owner of Redis for sagas.

Every key (:mod:`saga.store.keys`), the Lua scripts (``saga/store/lua/``, each documenting
its keys at its top), the saga hash's layout and the one-script commit of a transition.
"""
