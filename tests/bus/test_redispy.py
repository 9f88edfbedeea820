"""One test per redis-py internal that bus/_redispy/ uses (its __init__ docstring numbers them).

A redis-py release that moves one of them fails here, naming it, rather than slowing the lean
paths down, breaking a cluster failover or turning TLS off somewhere else. These run in both
of CI's dependency runs, on the newest and the lowest redis-py the declared range admits.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import inspect
import textwrap
import warnings
from importlib.metadata import version

import pytest
from redis import exceptions as rx
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

import bus
from bus import _redispy
from bus._cluster import cluster_client, owner_of, slot_of
from bus._connection import is_lean, send_batch
from bus._redispy import connection as lean
from bus._redispy import pool as lean_pool

pytestmark = pytest.mark.anyio

REDIS_PY = version("redis")


def moved(internal: str) -> str:
    return f"redis-py {REDIS_PY} changed {internal}: update bus/_redispy/ (and the list in its __init__.py)"


async def test_1_the_hiredis_parser_gives_its_reader_and_stream(real_redis: bus.Redis) -> None:
    pool = real_redis.connection_pool
    connection = await pool.get_connection()
    try:
        parser = getattr(connection, "_parser", None)
        assert type(parser) is lean._HiredisParser, moved("Connection._parser (redis-py's hiredis parser)")
        for name in ("_reader", "_stream", "_read_size", "_connected", "handle_push_response"):
            assert hasattr(parser, name), moved(f"_AsyncHiredisParser.{name}")
        assert parser._stream is connection._reader, moved("_AsyncHiredisParser._stream")
        assert parser._connected is True, moved("_AsyncHiredisParser._connected")
        assert parser._reader.gets() is lean._NOT_ENOUGH_DATA, moved("redis._parsers.hiredis.NOT_ENOUGH_DATA")
        assert await connection.exchange([("PING",), ("ECHO", "x")]) == [b"PONG", b"x"]
        # a push message (RESP3) goes to the parser's own handling, and the reply after it is read
        parser._reader.feed(b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n+OK\r\n")
        assert await connection.read_replies(1) == [b"OK"]
        # the reader makes redis-py's own errors of error replies: the lost-link family is raised,
        # alone or first in an array, and the connection is dropped (a read cut short)
        for wire in (b"-LOADING Redis is loading\r\n", b"*2\r\n-LOADING Redis is loading\r\n:1\r\n"):
            parser._reader.feed(wire)
            with pytest.raises(rx.BusyLoadingError):
                await connection.read_replies(1)
            assert not connection.is_connected
            await connection.connect()
            parser = connection._parser
    finally:
        await pool.release(connection)


async def test_1_another_parser_is_read_through_its_read_response(real_redis_url: str) -> None:
    from redis._parsers import _AsyncRESP2Parser

    options = _redispy.pool_options(real_redis_url)
    pool = _redispy.LeanPool(**{**options, "parser_class": _AsyncRESP2Parser})
    client = bus.Redis(connection_pool=pool)
    try:
        assert await send_batch(client, [("PING",), ("ECHO", "x")], parse=False) == [b"PONG", b"x"]
        connection = pool._available_connections[-1]
        assert callable(getattr(connection._parser, "read_response", None)), moved(
            "Connection._parser.read_response"
        )
        assert not connection.ready()  # its checks are redis-py's own: the pool's checkout makes them
    finally:
        await client.aclose()
        await pool.disconnect()


async def test_1_a_ready_connection_is_one_with_nothing_unread(real_redis: bus.Redis) -> None:
    pool = real_redis.connection_pool
    assert isinstance(pool, _redispy.LeanPool)
    connection = await pool.get_connection()
    try:
        assert connection.ready()
        stream = connection._parser._stream
        stream.feed_data(b"+PONG\r\n")  # where a reply nobody read waits: the stream's buffer
        assert getattr(stream, "_buffer", None), moved("asyncio.StreamReader._buffer")
        assert not connection.ready(), moved("asyncio.StreamReader._buffer")
    finally:
        await pool.release(connection)
    assert pool.take() is None  # not taken as it is: redis-py's checkout drops what is unread
    assert await send_batch(real_redis, [("ECHO", "mine")]) == [b"mine"]
    taken = pool.take()
    assert taken is not None
    assert taken.ready()
    assert pool.give_back(taken)


async def test_2_a_connected_connection_writes_to_its_stream_writer(real_redis: bus.Redis) -> None:
    pool = real_redis.connection_pool
    connection = await pool.get_connection()
    try:
        writer = getattr(connection, "_writer", None)
        assert isinstance(writer, asyncio.StreamWriter), moved("Connection._writer")
    finally:
        await pool.release(connection)


async def test_3_the_host_error_text_names_the_server(real_redis: bus.Redis) -> None:
    connection = await real_redis.connection_pool.get_connection()
    try:
        host_error = getattr(connection, "_host_error", None)
        assert callable(host_error), moved("Connection._host_error")
        assert str(connection.port) in host_error(), moved("Connection._host_error")
    finally:
        await real_redis.connection_pool.release(connection)


async def test_4_a_read_moves_the_next_health_check(real_redis: bus.Redis) -> None:
    connection = await real_redis.connection_pool.get_connection()
    try:
        assert connection.health_check_interval, "bus.connect sets a health-check interval"
        connection.next_health_check = 0
        await connection.send_packed_command(connection.pack_commands([("PING",)]))
        assert await connection.read_replies(1) == [b"PONG"]
        assert connection.next_health_check > asyncio.get_running_loop().time(), moved(
            "Connection.next_health_check"
        )
        # and redis-py's health check is still the one that reads it
        assert "next_health_check" in inspect.getsource(Connection.check_health), moved(
            "Connection.next_health_check"
        )
    finally:
        await real_redis.connection_pool.release(connection)


async def test_5_redis_py_writes_through_the_guarded_send(real_redis_url: str) -> None:
    sent: list[int] = []

    class Counting(_redispy.GuardedTCPConnection):
        async def _send_packed_command(self, command: object) -> None:
            sent.append(1)
            await super()._send_packed_command(command)  # type: ignore[arg-type]

    port = int(real_redis_url.rsplit(":", 1)[1].split("/", maxsplit=1)[0])
    connection = Counting(host="127.0.0.1", port=port, protocol=2)
    try:
        await connection.connect()
        before = len(sent)
        await connection.send_command("PING")
        assert await connection.read_response() == b"PONG"
        assert len(sent) == before + 1, moved("Connection._send_packed_command (send_packed_command's write)")
        writer, connection._writer = connection._writer, None  # as redis-py's disconnect leaves it
        with pytest.raises(rx.ConnectionError, match="closed under this command"):
            await connection._send_packed_command([b"*1\r\n$4\r\nPING\r\n"])
        connection._writer = writer
    finally:
        await connection.disconnect()


async def test_6_the_pool_has_what_the_checkout_without_a_wait_needs(real_redis: bus.Redis) -> None:
    pool = real_redis.connection_pool
    assert isinstance(pool, _redispy.LeanPool)
    for name in (*lean_pool._LEAN_POOL_NEEDS, "_in_maintenance"):
        assert hasattr(pool, name), moved(f"BlockingConnectionPool.{name}")
    assert lean_pool._ReleasedEvent is not None, moved("redis.event.AsyncAfterConnectionReleasedEvent")
    assert pool.lean_checkout, moved("the blocking pool's internals")
    free = list(pool._available_connections)
    connection = await pool.get_connection()
    assert connection in pool._in_use_connections, moved("BlockingConnectionPool._in_use_connections")
    await pool.release(connection)
    assert connection in pool._available_connections, moved("BlockingConnectionPool._available_connections")
    assert len(pool._available_connections) == max(len(free), 1)


async def test_10_a_release_reaches_a_pending_re_auth_and_every_other_listener(real_redis: bus.Redis) -> None:
    pool = real_redis.connection_pool
    assert isinstance(pool, _redispy.LeanPool)
    assert lean_pool._ReAuthListener is not None, moved("redis.event.AsyncReAuthConnectionListener")
    mapping = getattr(pool._event_dispatcher, "_event_listeners_mapping", None)
    assert isinstance(mapping, dict), moved("EventDispatcher._event_listeners_mapping")
    assert lean_pool._only_re_auth_listens(pool._event_dispatcher), moved("the default release listeners")
    connection = await pool.get_connection()
    assert connection._re_auth_token is None, moved("Connection._re_auth_token")

    re_auths: list[object] = []

    async def re_auth() -> None:
        re_auths.append(connection._re_auth_token)

    connection.re_auth = re_auth  # type: ignore[method-assign]
    connection._re_auth_token = token = object()  # a token the credential provider refreshed
    await pool.release(connection)
    assert re_auths == [token], "a connection with a new token must be re-authenticated on release"

    heard: list[object] = []

    class Listener:
        async def listen(self, event: object) -> None:
            heard.append(event.connection)  # type: ignore[attr-defined]

    pool._event_dispatcher.register_listeners({lean_pool._ReleasedEvent: [Listener()]})
    assert not lean_pool._only_re_auth_listens(pool._event_dispatcher)
    connection = await pool.get_connection()
    connection._re_auth_token = None
    await pool.release(connection)
    assert heard == [connection], "an application's own listener hears every release"


def test_7_cluster_nodes_connect_with_the_guarded_class() -> None:
    for scheme, expected, tls in (
        ("redis+cluster", _redispy.GuardedTCPConnection, None),
        ("rediss+cluster", _redispy.GuardedTLSConnection, SSLConnection),
    ):
        client = cluster_client(f"{scheme}://127.0.0.1:7000,127.0.0.1:7001", {})
        manager = client.nodes_manager
        assert manager.connection_kwargs.get("connection_class") is expected, moved(
            "NodesManager.connection_kwargs"
        )
        for node in manager.startup_nodes.values():
            assert node.connection_class is expected, moved("ClusterNode.connection_class")
        # a node learnt later is built from the manager's kwargs, as redis-py does
        later = ClusterNode("127.0.0.1", 7002, **manager.connection_kwargs)
        assert later.connection_class is expected, moved("ClusterNode(**connection_kwargs)")
        if tls:
            assert issubclass(later.connection_class, tls)


def test_8_the_close_rule_matches_the_installed_redis_py() -> None:
    in_place = hasattr(RedisCluster, "_request_refresh")
    assert _redispy.REFRESHES_IN_PLACE is in_place
    if in_place:
        # from 8.2 on redis-py's own code never closes the client: only its owner does
        callers = {
            node.name
            for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(RedisCluster))))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and "self.aclose()" in ast.unparse(node)
        }
        owners = {"close", "_release_usage", "__aexit__"}  # the owner's close, by name or context
        assert callers <= owners, moved(f"who calls RedisCluster.aclose ({sorted(callers - owners)})")
    else:
        for name in ("update_active_connections_for_reconnect", "disconnect_free_connections"):
            assert callable(getattr(ClusterNode, name, None)), moved(f"ClusterNode.{name}")
        assert "_initialize" in inspect.getsource(RedisCluster.__init__), moved("RedisCluster._initialize")


@pytest.mark.cluster
async def test_8_a_closed_cluster_client_leaves_nothing_for_its_finalizer() -> None:
    from tests.cluster import shared_cluster

    client = bus.connect(shared_cluster().url)
    await client.set("{x}k", "v")
    assert await send_batch(client, [("GET", "{x}k")]) == [b"v"]
    await client.aclose()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del client
        gc.collect()
    assert [str(w.message) for w in caught] == [], moved("RedisCluster.aclose / __del__")


@pytest.mark.cluster
async def test_9_the_master_of_a_slot_and_a_new_read_of_the_slot_map() -> None:
    from tests.cluster import shared_cluster

    client = bus.connect(shared_cluster().url)
    try:
        await client.ping()
        owner = owner_of(client, slot_of("{orders:0}:x"))
        await _redispy.reread_slot_map(client)  # type: ignore[arg-type]
        assert owner_of(client, slot_of("{orders:0}:x")) == owner, moved("NodesManager.initialize")
        assert owner.count(":") == 1, moved("NodesManager.get_node_from_slot")
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("url", "base", "lean"),
    [
        ("redis://127.0.0.1:6379/0", Connection, True),
        ("rediss://127.0.0.1:6379/0", SSLConnection, True),
        ("unix:///tmp/redis.sock", UnixDomainSocketConnection, False),
    ],
)
async def test_the_lean_class_is_always_a_subclass_of_redis_pys_own(url: str, base: type, lean: bool) -> None:
    """The TLS rule: whatever redis-py picks for a URL, the pool's class is that class."""
    client = bus.connect(url)
    try:
        connection_class = client.connection_pool.connection_class
        assert issubclass(connection_class, base)
        assert is_lean(client) is lean
    finally:
        await client.aclose()


def test_a_tls_url_never_gets_a_connection_class_without_tls() -> None:
    with pytest.raises(ValueError, match="does not speak it"):
        _redispy.lean_connection_class("rediss://h:1/0", Connection)
    assert _redispy.lean_connection_class("rediss://h:1/0", SSLConnection) is _redispy.LeanTLSConnection


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://u:hunter2@127.0.0.1:6379/0", "scheme"),
        ("redis://u:hunter2@127.0.0.1:6379/0?socket_timeout=soon", "socket_timeout"),
        ("redis://u:hunter2@127.0.0.1:6379/0?ssl_ca_certs=/ca.pem", "ssl_ca_certs"),
    ],
)
def test_an_unusable_url_is_one_error_with_the_password_hidden(url: str, reason: str) -> None:
    with pytest.raises(bus.InvalidRedisURL) as caught:
        bus.connect(url)
    assert "hunter2" not in str(caught.value)
    assert "u:***@" in caught.value.url
    assert reason in str(caught.value) or reason == "scheme"
