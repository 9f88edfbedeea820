"""A :class:`~saga.SagaClient` for synchronous code: Django views, Flask handlers, Celery tasks, scripts.

One client runs an event loop in a daemon thread of its own and keeps one
:class:`~saga.SagaClient` there, with its Redis connection pool, for as long as it lives
(make one per process, at start-up, and share it). Each method hands its call to that loop
(anyio's blocking portal) and blocks the calling thread until the answer comes, so any
number of threads may call at once: their calls interleave on the loop and share the pool
(``ClientConfig.max_connections``; a :meth:`SyncSagaClient.wait` holds one connection while
it blocks). Errors are the async client's, raised in the calling thread.

Redis clients are bound to the event loop that opened their connections, so the Redis
client is built inside the loop thread: from ``url`` by :func:`bus.connect`, or by the
``connect`` function given.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal

import bus
from bus import ClientConfig, Redis
from saga.core.model import SagaState
from saga.core.query import SagaQuery
from saga.core.states import SagaStatus
from saga.definition.registry import Registry
from saga.definition.saga import Saga
from saga.runtime.client import SagaClient
from saga.runtime.config import EngineConfig

T = TypeVar("T")


class SyncSagaClient:
    """Start, read, signal, cancel and wait for sagas from synchronous code (thread-safe).

    ``registry`` is the app's (``app.registry``); ``url`` the Redis URL (default
    ``$REDSAGA_REDIS_URL``); ``config``, ``source`` and ``principal`` are
    :class:`~saga.SagaClient`'s; ``connect`` builds the Redis client instead of ``url``
    (called once, in the client's loop thread). Close it with :meth:`close` or a ``with``
    block; a client never closed dies with the process (its thread is a daemon).
    """

    def __init__(
        self,
        registry: Registry,
        url: str | None = None,
        *,
        config: EngineConfig | None = None,
        client_config: ClientConfig | None = None,
        source: str = "client",
        principal: str | None = None,
        connect: Callable[[], Redis] | None = None,
    ) -> None:
        self._ready = threading.Event()
        self._portal: BlockingPortal | None = None
        self._stop: anyio.Event | None = None
        self._thread = threading.Thread(
            target=anyio.run, args=(self._serve,), name="redsaga-client", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        build = connect or functools.partial(bus.connect, url, client_config)
        try:
            self._client: SagaClient = self._call(_open, build, registry, config, source, principal)
        except BaseException:
            self.close()
            raise

    async def _serve(self) -> None:
        async with BlockingPortal() as portal:
            self._stop = anyio.Event()
            self._portal = portal
            self._ready.set()
            await self._stop.wait()
            await portal.stop(cancel_remaining=True)  # calls still waiting end now
        client: SagaClient | None = getattr(self, "_client", None)  # None: opening failed
        if client is not None:  # outside the portal, whose stop cancelled its scope
            await client.redis.aclose()

    def _call(self, func: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        portal = self._portal
        if portal is None or self._stop is None or self._stop.is_set():
            raise RuntimeError("this SyncSagaClient is closed")
        return portal.call(functools.partial(func, *args, **kwargs))

    @property
    def client(self) -> SagaClient:
        """The async client underneath (use it only from inside this client's loop)."""
        return self._client

    def start(
        self,
        definition: Saga[Any] | str,
        data: object,
        *,
        version: int | None = None,
        saga_id: str | None = None,
        by: str = "",
    ) -> str:
        """Start a saga; return its id (:meth:`saga.SagaClient.start`)."""
        return self._call(self._client.start, definition, data, version=version, saga_id=saga_id, by=by)

    def get(self, saga_id: str, *, context: str | None = None) -> SagaState:
        """The saga's current state (:meth:`saga.SagaClient.get`)."""
        return self._call(self._client.get, saga_id, context=context)

    def query(self, saga_id: str, *, context: str | None = None) -> SagaQuery:
        """The saga's status and what it waits for (:meth:`saga.SagaClient.query`)."""
        return self._call(self._client.query, saga_id, context=context)

    def signal(self, token: str, data: object = None, *, by: str = "") -> str:
        """Deliver a resume token with ``data`` (:meth:`saga.SagaClient.signal`)."""
        return self._call(self._client.signal, token, data, by=by)

    def cancel(self, saga_id: str, *, context: str | None = None, reason: str = "", by: str = "") -> None:
        """Ask for the saga to be cancelled (:meth:`saga.SagaClient.cancel`)."""
        self._call(self._client.cancel, saga_id, context=context, reason=reason, by=by)

    def list(self, status: SagaStatus | str, *, context: str | None = None, limit: int = 100) -> list[str]:
        """Ids of sagas in ``status`` (:meth:`saga.SagaClient.list`)."""
        return self._call(self._client.list, status, context=context, limit=limit)

    def wait(self, saga_id: str, *, timeout: float | None = None, context: str | None = None) -> SagaState:
        """Block until the saga ends or is dead-lettered (:meth:`saga.SagaClient.wait`)."""
        return self._call(self._client.wait, saga_id, timeout=timeout, context=context)

    def result(self, saga_id: str, *, timeout: float | None = None, context: str | None = None) -> Any:
        """Block until the saga ends; its output, or its end's error (:meth:`saga.SagaClient.result`)."""
        return self._call(self._client.result, saga_id, timeout=timeout, context=context)

    def close(self) -> None:
        """Close the Redis connections and stop the loop thread (a second call does nothing).

        Calls still running in other threads are cancelled; later calls raise ``RuntimeError``.
        """
        portal, stop = self._portal, self._stop
        if portal is None or stop is None or stop.is_set():
            return
        portal.call(stop.set)
        self._thread.join()

    def __enter__(self) -> SyncSagaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _open(
    build: Callable[[], Redis],
    registry: Registry,
    config: EngineConfig | None,
    source: str,
    principal: str | None,
) -> SagaClient:
    """The async client, made in the loop thread (where its Redis client must be made)."""
    return SagaClient(build(), registry, config=config, source=source, principal=principal)
