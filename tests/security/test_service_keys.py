"""A service that publishes domain events through the outbox, with only the keyring ``saga
keys issue`` wrote for it, on a real ``redis-server``: the relay (no keyring of its own)
publishes the row as the service signed it, and a subscriber holding only its own keyring
accepts the event."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import msgspec
import pytest
from typer.testing import CliRunner

import bus
import relay
from bus import Authenticator, Bus, Stream, Worker
from bus._auth import load_keyrings
from bus._scripts import load_libraries
from redsaga.cli._functions import libraries
from redsaga.cli.main import app as cli
from saga import App
from tests.faults.servers import PrivateRedis
from tests.helpers import dead_letters

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
EVENTS = Stream.named("payments.events")
SEEN: list[str] = []


class CardCharged(msgspec.Struct, tag=True):
    order: str


shipping = Bus("shipping")


@shipping.subscribe(EVENTS, group="shipping", messages=[CardCharged], from_beginning=True)
async def ship(event: CardCharged) -> None:
    SEEN.append(event.order)


APP = App("shipping", buses=[shipping])
APP_REF = "tests.security.test_service_keys:APP"


def _issue(master: Path, out: Path, *args: str) -> tuple[int, str]:
    base = ["keys", "issue", "--master", str(master), "--app", APP_REF, "--out", str(out)]
    result = CliRunner().invoke(cli, [*base, *args])
    return result.exit_code, result.stderr


async def test_a_service_publishes_events_through_the_outbox_with_its_issued_keyring(
    private_redis_server: PrivateRedis, tmp_path: Path
) -> None:
    master = tmp_path / "master.json"
    assert CliRunner().invoke(cli, ["keys", "generate", "--master", str(master)]).exit_code == 0
    code, error = _issue(master, tmp_path / "none.json", "-p", "service:payments")
    assert code == 1
    assert "service:payments is not a principal of this app" in error  # nothing says what it sends
    payments, receiver = tmp_path / "payments.json", tmp_path / "shipping.json"
    assert (
        _issue(master, payments, "-p", "service:payments", "--publishes", "payments=payments.events")[0] == 0
    )
    assert _issue(master, receiver, "-p", "service:shipping")[0] == 0
    code, error = _issue(master, tmp_path / "bad.json", "--publishes", "payments")
    assert code == 2
    assert "'payments': expected SERVICE=STREAM" in error

    dsn = f"sqlite:///{tmp_path / 'payments.db'}"
    await relay.init_db(dsn)
    outbox = relay.Outbox(auth=Authenticator(load_keyrings(payments)))  # service:payments only
    with sqlite3.connect(tmp_path / "payments.db") as conn:  # the business transaction
        outbox.add(conn, EVENTS, CardCharged(order="o-1"))

    redis = bus.connect(private_redis_server.url)
    try:
        await load_libraries(redis, libraries())
        publisher = relay.Relay.connect(dsn, redis)  # no keyring: it forwards the signed row
        await publisher.store.open()
        try:
            assert await publisher.step() == relay.Round(claimed=1, held_back=0, refused=False)
        finally:
            await publisher.close()
        SEEN.clear()
        worker = Worker(redis, shipping, auth=Authenticator(load_keyrings(receiver)), consumer="c1")
        await worker.setup()
        with anyio.fail_after(30):
            await worker.run_until_idle()
        assert SEEN == ["o-1"]
        assert await dead_letters(redis, EVENTS) == []
    finally:
        await redis.aclose()
