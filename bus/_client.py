"""The one factory that builds Redis clients, real or embedded.

Every client speaks RESP2 (so replies have one shape on Redis and on fakeredis), sets
socket, connect and health-check timeouts (a half-open link must not hang a worker), and
retries connection errors with jittered back-off. ``memory://`` gives an embedded fakeredis
server emulating Redis 7.0, each URL its own server, for the demo and fast unit tests.
"""

from __future__ import annotations

import os
import re
from typing import Any, Final, cast
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisError

from bus._cluster import cluster_client, is_cluster_url
from bus._config import ClientConfig
from bus._errors import InvalidRedisURL
from bus._redispy import LeanPool, pool_options

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
    try:
        # redis-py's reading of the URL (TLS, credentials, query options win over the
        # defaults above, as in redis-py's from_url), with the lean twin of its connection class
        pool = LeanPool(**{**options, **pool_options(url)})
        # one connection built (not opened) now, so an option its class does not take, or a
        # value it refuses, fails here rather than at the first command
        pool.connection_class(**pool.connection_kwargs)
    except (ValueError, TypeError, RedisError) as error:  # redis-py's: a bad scheme, option or value
        raise InvalidRedisURL(redacted(url), _reason(error)) from None
    return redis.Redis.from_pool(pool)


def _reason(error: Exception) -> str:
    text = str(error)
    if isinstance(error, TypeError) and "ssl_" in text:  # a TLS option on a plain-text URL
        option = text.rsplit("'", 2)[-2] if text.count("'") >= 2 else "a TLS option"
        return f"{option} is a TLS option: use a rediss:// URL"
    return text


def redacted(url: str) -> str:
    """``url`` with the password of its userinfo (and a ``password`` query option) as ``***``."""
    parts = urlsplit(url)
    user, at, _host = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at and ":" in user:
        netloc = f"{user.split(':', 1)[0]}:***@{_host}"
    query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


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
