"""The sagas a worker process keeps decoded: its orchestrators' cache, shared with its clients.

An orchestrator decides a reply on the saga as its last commit left it, so it reads the saga
hash only for a saga it has not written itself. A saga this process started -- from a client
made by :meth:`saga.SagaWorker.client`, a schedule, or a child saga one of its steps
started -- is kept here as its start wrote it, so its first reply needs no read either.
Every entry is a guess checked by revision on commit: a saga that moved on elsewhere costs
one lost race and a read, never a wrong state.
"""

from __future__ import annotations

from collections import OrderedDict

from saga.store.codec import Loaded


class SagaCache:
    """A least-recently-used map of ``(context, saga id)`` to the saga as last written here.

    Ended sagas are not kept (nothing more is decided for them). ``size`` 0 keeps nothing.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._sagas: OrderedDict[tuple[str, str], Loaded] = OrderedDict()

    def get(self, context: str, saga_id: str) -> Loaded | None:
        """The saga as this process last wrote it, or ``None``."""
        key = (context, saga_id)
        loaded = self._sagas.get(key)
        if loaded is not None:
            self._sagas.move_to_end(key)
        return loaded

    def keep(self, loaded: Loaded) -> None:
        """Keep ``loaded``, whose ``state.revision`` is the revision its commit returned."""
        key = (loaded.state.context, loaded.state.id)
        if self.size == 0 or loaded.state.status.terminal:
            self._sagas.pop(key, None)
            return
        self._sagas[key] = loaded
        self._sagas.move_to_end(key)
        while len(self._sagas) > self.size:
            self._sagas.popitem(last=False)

    def forget(self, context: str, saga_id: str) -> None:
        """Drop a saga (after a lost race: the next decision reads it)."""
        self._sagas.pop((context, saga_id), None)

    def __len__(self) -> int:
        return len(self._sagas)
