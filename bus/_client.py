"""The one factory that builds Redis clients, real or embedded.

Every client speaks RESP2 (so replies have one shape on Redis and on fakeredis), sets
socket, connect and health-check timeouts (a half-open link must not hang a worker), and
retries connection errors with jittered back-off. ``memory://`` gives an embedded fakeredis
server emulating Redis 7.0, each URL its own server, for the demo and fast unit tests.
"""

from __future__ import annotations

import os
from typing import Any, Final, cast

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from bus._cluster import cluster_client, is_cluster_url
from bus._config import ClientConfig
from bus._connection import FastConnection, FastPool

URL_ENV: Final = "REDSAGA_REDIS_URL"
MEMORY_URL: Final = "memory://"
RESP_PROTOCOL: Final = 2

Redis = redis.Redis
"""The asyncio client type redsaga works with (``redis.asyncio.Redis``)."""


def resolve_url(url: str | None) -> str:
    """Return ``url``, else ``$REDSAGA_REDIS_URL``, else the embedded server's ``memory://``."""
    return url or os.environ.get(URL_ENV) or MEMORY_URL


def connect(url: str | None = None, config: ClientConfig | None = None) -> Redis:
    """Build a client for ``url`` (see :func:`resolve_url`); no connection is opened yet.

    ``redis+cluster://host:port[,host:port…]`` (``rediss+cluster://`` with TLS) builds a
    Redis Cluster client (see :mod:`bus._cluster`).
    """
    config = config or ClientConfig()
    url = resolve_url(url)
    if url.startswith(MEMORY_URL):
        return _embedded()
    options: dict[str, Any] = {
        "max_connections": config.max_connections,
        "timeout": config.socket_timeout_s,
        "protocol": RESP_PROTOCOL,
        "socket_timeout": config.socket_timeout_s,
        "socket_connect_timeout": config.connect_timeout_s,
        "health_check_interval": config.health_check_interval_s,
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), config.retries),
        "client_name": config.client_name,
    }
    if is_cluster_url(url):
        # The cluster client has the same command methods; its batches are split by node
        # (bus/_cluster.py), so the engine treats it as the one client type it knows.
        return cast(Redis, cluster_client(url, options))
    pool = FastPool.from_url(url, connection_class=FastConnection, **options)
    return redis.Redis.from_pool(pool)


def is_embedded(client: Redis) -> bool:
    """Whether ``client`` talks to an embedded fakeredis server."""
    return type(client).__module__.startswith("fakeredis")


def _embedded() -> Redis:
    # Imported here: fakeredis and lupa load only when the embedded server is used.
    import fakeredis  # noqa: PLC0415
    import fakeredis.aioredis  # noqa: PLC0415

    server = fakeredis.FakeServer(version=(7, 0))
    client: Redis = fakeredis.aioredis.FakeRedis(server=server, protocol=RESP_PROTOCOL)
    return client
