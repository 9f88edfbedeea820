"""TLS: a ``rediss://`` URL always yields a verified TLS connection or an error, never plain text.

Against private ``redis-server`` s with TLS ports: the certificate chain and the host name are
checked, every ``ssl_*`` option docs/security.md lists does what it says, and a ``rediss://``
URL (single server or cluster) to a plain-text port fails to connect. These run on every
redis-py version the project declares (CI's newest and lowest dependency runs).
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NamedTuple

import anyio
import pytest
from redis.asyncio.connection import SSLConnection
from redis.exceptions import RedisClusterException, RedisError

import bus
from bus._connection import is_lean
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import app
from saga import SagaClient, SagaStatus, SagaWorker
from tests.faults.servers import PrivateRedis, free_port, require_binary

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


def make_certificates(directory: Path) -> dict[str, Path]:
    """Throwaway certificates: a CA; server certificates for 127.0.0.1 and for another host
    name and a client certificate, all signed by it; and a server certificate for 127.0.0.1
    signed by a second CA that the clients do not trust."""
    openssl = str(require_binary("openssl"))
    names = ("ca", "rogue-ca", "server", "elsewhere", "rogue", "client")
    files = {f"{name}{part}": directory / f"{name}{part}.pem" for name in names for part in ("", "-key")}

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    for ca, subject in (("ca", "/CN=redsaga test CA"), ("rogue-ca", "/CN=someone else's CA")):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", subject,
            "-keyout", str(files[f"{ca}-key"]), "-out", str(files[ca]))  # fmt: skip

    def issue(name: str, ca: str, subject: str, extension: str) -> None:
        csr = directory / f"{name}.csr"
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
            "-keyout", str(files[f"{name}-key"]), "-out", str(csr))  # fmt: skip
        extensions = directory / f"{name}.cnf"
        extensions.write_text(f"{extension}\n")
        run("x509", "-req", "-in", str(csr), "-CA", str(files[ca]), "-CAkey", str(files[f"{ca}-key"]),
            "-CAcreateserial", "-days", "1", "-extfile", str(extensions),
            "-out", str(files[name]))  # fmt: skip

    issue("server", "ca", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1")
    issue("elsewhere", "ca", "/CN=elsewhere.invalid", "subjectAltName=DNS:elsewhere.invalid")
    issue("rogue", "rogue-ca", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1")
    issue("client", "ca", "/CN=redsaga client", "basicConstraints=CA:FALSE")
    return files


class TLSRedis(NamedTuple):
    """A private TLS ``redis-server``: its TLS port and the certificate files."""

    port: int
    files: dict[str, Path]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_certificates(tmp_path_factory.mktemp("certificates"))


@asynccontextmanager
async def tls_server(
    directory: Path, files: dict[str, Path], *, certificate: str = "server", auth_clients: bool = False
) -> AsyncIterator[TLSRedis]:
    """A private ``redis-server`` presenting ``certificate`` on a TLS port beside its plain one
    (the harness's readiness check uses the plain one)."""
    port = free_port()
    options = (
        "--tls-port", str(port), "--tls-cert-file", str(files[certificate]),
        "--tls-key-file", str(files[f"{certificate}-key"]), "--tls-ca-cert-file", str(files["ca"]),
        "--tls-auth-clients", "yes" if auth_clients else "no",
    )  # fmt: skip
    server = PrivateRedis(directory, options=options)
    await server.start()
    try:
        yield TLSRedis(port, files)
    finally:
        server.kill()


@pytest.fixture
async def tls_redis(tmp_path: Path, certificates: dict[str, Path]) -> AsyncIterator[TLSRedis]:
    async with tls_server(tmp_path / "redis", certificates) as server:
        yield server


def _config() -> bus.ClientConfig:
    return bus.ClientConfig(retries=0, connect_timeout_s=2, socket_timeout_s=2)


async def refused(url: str) -> BaseException:
    """The error a first write over ``url`` meets (the test fails if it succeeds)."""
    redis = bus.connect(url, _config())
    try:
        with pytest.raises(bus.BusError) as caught:
            await bus.Publisher(redis, source="t").publish(
                bus.Stream.named("s"), Order(id="o", customer="c", lines=[], total_cents=1)
            )
        return caught.value
    finally:
        await redis.aclose()


def _text(error: BaseException) -> str:
    return f"{error} {error.__cause__ or ''}"


async def speaks_tls(url: str) -> str:
    """Run a command over ``url``; the TLS version its (lean) connection negotiated."""
    redis = bus.connect(url, _config())
    try:
        assert await redis.ping()
        assert is_lean(redis), "the lean paths serve TLS too"
        pool = redis.connection_pool
        connection = await pool.get_connection()
        try:
            assert isinstance(connection, SSLConnection)
            ssl_object = connection._writer.get_extra_info("ssl_object")  # type: ignore[attr-defined]
            assert ssl_object is not None, "the connection of a rediss:// URL is not TLS"
            return str(ssl_object.version())
        finally:
            await pool.release(connection)
    finally:
        await redis.aclose()


async def test_sagas_run_over_tls_with_the_ca_named_in_the_url(tls_redis: TLSRedis) -> None:
    redis = bus.connect(f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_redis.files['ca']}")
    try:
        worker = SagaWorker(redis, app)
        client = SagaClient(redis, app.registry)
        order = Order(id="o1", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=100)
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await client.start(order_fulfilment, order, saga_id="s1")
            with anyio.fail_after(30):
                while (await client.get("s1")).status != SagaStatus.COMPLETED:
                    await anyio.sleep(0.05)
            worker.stop()
    finally:
        await redis.aclose()


async def test_the_connection_of_a_tls_url_negotiates_tls(tls_redis: TLSRedis) -> None:
    version = await speaks_tls(f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_redis.files['ca']}")
    assert version.startswith("TLS")


async def test_plain_text_to_the_tls_port_fails(tls_redis: TLSRedis) -> None:
    await refused(f"redis://127.0.0.1:{tls_redis.port}/0")


async def test_a_tls_url_to_a_plain_text_port_fails_to_connect(real_redis_url: str) -> None:
    """Never plain text for a rediss:// URL: a plain-text server does not answer the handshake."""
    tls_url = real_redis_url.replace("redis://", "rediss://", 1)
    await refused(tls_url)
    await refused(f"{tls_url}?ssl_cert_reqs=none")  # unverified still means TLS, not plain text


async def test_without_the_ca_the_certificate_is_not_verified_and_refused(tls_redis: TLSRedis) -> None:
    assert "certificate verify failed" in _text(await refused(f"rediss://127.0.0.1:{tls_redis.port}/0"))


async def test_a_certificate_from_another_ca_is_refused(
    tmp_path: Path, certificates: dict[str, Path]
) -> None:
    async with tls_server(tmp_path, certificates, certificate="rogue") as server:
        error = await refused(f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={certificates['ca']}")
        assert "certificate verify failed" in _text(error)


async def test_a_certificate_for_another_host_name_is_refused_unless_told(
    tmp_path: Path, certificates: dict[str, Path]
) -> None:
    async with tls_server(tmp_path, certificates, certificate="elsewhere") as server:
        url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={certificates['ca']}"
        assert "127.0.0.1" in _text(await refused(url))  # the mismatch names the host asked for
        await speaks_tls(f"{url}&ssl_check_hostname=false")  # the chain is still checked


async def test_a_client_certificate_is_sent_when_the_server_asks(
    tmp_path: Path, certificates: dict[str, Path]
) -> None:
    async with tls_server(tmp_path, certificates, auth_clients=True) as server:
        url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={certificates['ca']}"
        await refused(url)
        client = f"ssl_certfile={certificates['client']}&ssl_keyfile={certificates['client-key']}"
        await speaks_tls(f"{url}&{client}")


async def test_unverified_tls_only_when_asked_for_in_so_many_words(tls_redis: TLSRedis) -> None:
    await speaks_tls(f"rediss://127.0.0.1:{tls_redis.port}/0?ssl_cert_reqs=none")


def test_a_tls_option_on_a_plain_text_url_is_refused_before_connecting() -> None:
    with pytest.raises(bus.InvalidRedisURL, match="ssl_ca_certs is a TLS option: use a rediss:// URL"):
        bus.connect("redis://127.0.0.1:6379/0?ssl_ca_certs=/etc/ca.pem")


@pytest.mark.cluster
async def test_a_tls_cluster_url_to_a_plain_text_cluster_fails_to_connect() -> None:
    from tests.cluster import shared_cluster

    redis = bus.connect(shared_cluster().url.replace("redis+cluster://", "rediss+cluster://", 1), _config())
    try:
        with pytest.raises((bus.BusError, RedisError, RedisClusterException)):
            await redis.ping()
    finally:
        await redis.aclose()
