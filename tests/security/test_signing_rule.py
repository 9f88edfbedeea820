"""One rule for signing in every process that writes entries: no keyring is an error.

``saga worker``, an embedded ``SagaWorker`` and ``SagaClient`` refuse to run without a
keyring (``tests/security/test_seams.py``); so do a plain ``bus.Worker``, a ``TaskClient``'s
actions and the outbox's writes, unless signing was turned off on purpose
(``REDSAGA_VERIFY=off`` or ``bus.SIGNING_OFF``). Each would otherwise write entries that a
signing reader dead-letters (a task answered, its saga left suspended), or accept entries
nobody checked. Reading needs no keyring: ``saga tasks list`` works with a Redis URL alone.
"""

from __future__ import annotations

import sqlite3

import pytest
from structlog.testing import capture_logs

import bus
import relay
from bus import AuthError
from bus.lowlevel import KEYRING_ENV, VERIFY_ENV
from saga import EngineConfig, Role, TaskClient
from saga.runtime.tasks import role_table
from tests.relay.conftest import OutboxDb, sqlite_db
from tests.relay.helpers import Charged
from tests.security.test_acl import STATELESS
from tests.security.test_attacks import World, world

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
__all__ = ["sqlite_db", "world"]  # the fixtures


@pytest.fixture
def no_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in the environment: no keyring, and nobody turned signing off."""
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    monkeypatch.delenv(KEYRING_ENV, raising=False)


@pytest.mark.usefixtures("no_keyring")
async def test_a_task_client_without_a_keyring_reads_but_refuses_to_act(world: World) -> None:
    tasks = TaskClient(
        world.users.client("redsaga.operator"), STATELESS["redsaga.orders"].registry, authorize=role_table({})
    )
    assert await tasks.list() == []  # a read: a Redis URL is enough
    for act in (
        lambda: tasks.claim("t-1", by="ann"),
        lambda: tasks.complete("t-1", {}, by="ann"),
        lambda: tasks.reassign("t-1", Role("managers"), by="ann"),
        tasks.fire_due,
    ):
        with pytest.raises(AuthError, match="signing is off: the TaskClient 'tasks'"):
            await act()


@pytest.mark.usefixtures("no_keyring")
async def test_a_bus_worker_without_a_keyring_refuses_to_start(world: World) -> None:
    with pytest.raises(AuthError, match=r"signing is off: the worker of 'shop'.*REDSAGA_VERIFY=off"):
        bus.Worker(world.users.client("redsaga.orders"), bus.Bus("shop"))


@pytest.mark.usefixtures("no_keyring")
def test_a_bus_worker_on_the_embedded_redis_or_with_signing_off_on_purpose_runs_and_says_so() -> None:
    for redis, auth in ((bus.connect(), None), (bus.connect("redis://127.0.0.1:1/0"), bus.SIGNING_OFF)):
        with capture_logs() as logs:
            bus.Worker(redis, bus.Bus("shop"), auth=auth)
        assert [(log["event"], log["process"]) for log in logs if log["log_level"] == "warning"] == [
            ("running unauthenticated: nothing is signed, every entry is accepted", "the worker of 'shop'")
        ]


def test_an_outbox_without_a_keyring_refuses_to_write_an_unsigned_row(
    sqlite_db: OutboxDb, no_keyring: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = relay.Outbox(sqlite_db.tables)
    with sqlite3.connect(sqlite_db.dsn.removeprefix("sqlite:///")) as conn:
        with pytest.raises(AuthError, match="signing is off: this outbox"):
            outbox.add(conn, "payments", Charged(order="o-1"))
        assert conn.execute(f"SELECT count(*) FROM {sqlite_db.tables.outbox}").fetchone() == (0,)
        monkeypatch.setenv(VERIFY_ENV, "off")  # turned off on purpose: written, unsigned
        outbox.add(conn, "payments", Charged(order="o-1"))
        assert conn.execute(f"SELECT count(*) FROM {sqlite_db.tables.outbox}").fetchone() == (1,)
    EngineConfig()  # nothing above changed the process's defaults
