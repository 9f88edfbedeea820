"""TLS: ``rediss://`` URLs reach a TLS-only ``redis-server``, verify its certificate with the CA
given in the URL, and run sagas; without the CA the connection is refused."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

import bus
from redsaga.examples.contracts import Line, Order
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.stateless import app
from saga import SagaClient, SagaStatus, SagaWorker
from tests.faults.servers import PrivateRedis, free_port, require_binary

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


def make_certificates(directory: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, signed by it."""
    openssl = str(require_binary("openssl"))
    files = {name: directory / f"{name}.pem" for name in ("ca", "ca-key", "server", "server-key")}

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=redsaga test CA",
        "-keyout", str(files["ca-key"]), "-out", str(files["ca"]))  # fmt: skip
    csr = directory / "server.csr"
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", str(files["server-key"]), "-out", str(csr))  # fmt: skip
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(files["ca"]), "-CAkey", str(files["ca-key"]),
        "-CAcreateserial", "-days", "1", "-extfile", str(extensions),
        "-out", str(files["server"]))  # fmt: skip
    return files


@pytest.fixture
async def tls_redis(tmp_path: Path) -> AsyncIterator[tuple[int, dict[str, Path]]]:
    """A private ``redis-server`` with a TLS port beside its plain one (the harness's readiness
    check uses the plain one); yields the TLS port and the certificate files."""
    files = make_certificates(tmp_path)
    port = free_port()
    options = (
        "--tls-port", str(port), "--tls-cert-file", str(files["server"]),
        "--tls-key-file", str(files["server-key"]), "--tls-ca-cert-file", str(files["ca"]),
        "--tls-auth-clients", "no",
    )  # fmt: skip
    server = PrivateRedis(tmp_path / "redis", options=options)
    await server.start()
    try:
        yield port, files
    finally:
        server.kill()


async def test_sagas_run_over_tls_with_the_ca_named_in_the_url(
    tls_redis: tuple[int, dict[str, Path]],
) -> None:
    port, files = tls_redis
    redis = bus.connect(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={files['ca']}")
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


@pytest.mark.parametrize("scheme", ["rediss", "redis"])
async def test_an_unverified_or_plain_connection_to_the_tls_port_fails(
    tls_redis: tuple[int, dict[str, Path]], scheme: str
) -> None:
    """``rediss://`` without the CA fails certificate verification; ``redis://`` is not TLS."""
    port, _ = tls_redis
    redis = bus.connect(f"{scheme}://127.0.0.1:{port}/0", bus.ClientConfig(retries=0, connect_timeout_s=2))
    try:
        with pytest.raises(bus.BusError):
            await bus.Publisher(redis, source="t").publish(
                bus.Stream.named("s"), Order(id="o", customer="c", lines=[], total_cents=1)
            )
    finally:
        await redis.aclose()
