"""The generated ACL users on a real ``redis-server``: the demo's saga system runs with each
process as its own user, signing with its own keyring, and Redis refuses nothing (``ACL LOG``
stays empty); a user cannot reach another context's or participant's keys, and the operator
user cannot write."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from anyio.abc import TaskGroup
from redis import exceptions as rx

import bus
from bus._auth import KEYRING_ENV, encode_keyrings, issue, stream_audience
from bus._lua import RECORD
from bus._scripts import Library
from redsaga.examples import stateless
from redsaga.examples.all import app as demo
from redsaga.examples.contracts import Line, Order
from redsaga.examples.inventory import inventory, stock
from redsaga.examples.orders import order_fulfilment
from redsaga.examples.payments import ledger, payments
from redsaga.examples.shipping import shipping
from relay import Relay, RelayConfig
from saga import (
    App,
    CommandContext,
    Participant,
    SagaAdmin,
    SagaClient,
    SagaNotFound,
    SagaStatus,
    SagaWorker,
    Versions,
)
from saga.ops.acl import acl_rules
from saga.ops.keyrings import issue_keyrings
from saga.ops.ui import create_app
from saga.ops.ui.formatting import saga_href
from saga.store.commit import TRANSITION
from saga.store.keys import Partition
from tests.faults.servers import PrivateRedis, require_binary
from tests.helpers import eventually
from tests.saga import compose_sagas, time_sagas
from tests.security.acl_users import Users, applied

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
ORDERS = Partition("orders", 0)
ORCHESTRATOR = App("orders", sagas=[order_fulfilment])
STATELESS = {
    "redsaga.orders": ORCHESTRATOR,
    "redsaga.orders.payments": App("payments", participants=[stateless.payments]),
    "redsaga.orders.inventory": App("inventory", participants=[stateless.inventory]),
    "redsaga.orders.shipping": App("shipping", participants=[stateless.shipping]),
}
WITH_OUTBOX = {
    "redsaga.orders": ORCHESTRATOR,
    "redsaga.orders.payments": App(
        "payments", participants=[payments], on_start=[ledger.open], on_stop=[ledger.close]
    ),
    "redsaga.orders.inventory": App(
        "inventory", participants=[inventory], on_start=[stock.open], on_stop=[stock.close]
    ),
    "redsaga.orders.shipping": App("shipping", participants=[shipping]),
}


@pytest.fixture
async def users(private_redis_server: PrivateRedis) -> AsyncIterator[Users]:
    async with applied(private_redis_server, demo) as found:
        yield found


def order(n: int, **failures: str) -> Order:
    return Order(id=f"o{n}", customer="c", lines=[Line(sku="s", quantity=1)], total_cents=100, **failures)


async def dead_lettered(users: Users) -> bool:
    return bool(await users.admin.xlen(ORDERS.commands("payments").dlq_key))


async def ended(client: SagaClient, ids: list[str]) -> dict[str, SagaStatus]:
    """Wait for the sagas' ends as the client user does (``SagaClient.wait``, its ACL)."""

    async def all_started() -> bool:
        try:
            return all([await client.get(i) for i in ids])
        except SagaNotFound:  # started by request: the orchestrator has not taken it yet
            return False

    await eventually(all_started, 30, f"sagas {ids} started")
    return {i: (await client.wait(i, timeout=30)).status for i in ids}


async def start_all(tg: TaskGroup, workers: list[SagaWorker]) -> None:
    """Run every worker in ``tg`` and wait until each has started (bounded)."""
    for worker in workers:
        tg.start_soon(worker.run)
    with anyio.fail_after(30):
        for worker in workers:
            await worker.started.wait()


def principal_of(user: str) -> str:
    """The principal a process logged in as ACL user ``user`` signs as."""
    parts = user.split(".")
    return f"orchestrator:{parts[1]}" if len(parts) == 2 else f"participant:{parts[2]}"


def workers_of(users: Users, roles: dict[str, App]) -> list[SagaWorker]:
    """One worker per role, logged in as its user and signing as its principal."""
    return [
        SagaWorker(users.client(name), app, config=users.config(principal_of(name)))
        for name, app in roles.items()
    ]


def web_client(users: Users, app: App) -> SagaClient:
    """A client as the app's web front end: the client user, the client:web keyring."""
    return SagaClient(users.client("redsaga.client"), app.registry, config=users.config("client:web"))


async def run_orders(
    users: Users, roles: dict[str, App], orders: dict[str, Order], relay_dsns: list[str] = ()
) -> dict[str, SagaStatus]:
    """Run one worker per role, each logged in as its own user (and relays as the relay user),
    start ``orders`` as a client and a poison entry on payments' stream; return how the sagas
    ended. Every entry is signed, by the process that wrote it."""
    workers = workers_of(users, roles)
    relay_client = users.client("redsaga.relay")
    relays = [
        Relay.connect(dsn, relay_client, config=RelayConfig(poll_interval_s=0.02)) for dsn in relay_dsns
    ]
    async with anyio.create_task_group() as tg:
        await start_all(tg, workers)
        for one in relays:
            tg.start_soon(one.run)
        client = web_client(users, roles["redsaga.orders"])
        for saga_id, data in orders.items():
            await client.start(order_fulfilment, data, saga_id=saga_id)
        # a poison entry on payments' stream: the payments user dead-letters it on its own
        await users.admin.xadd(ORDERS.commands("payments").key, {"garbage": "x"})
        states = await ended(client, list(orders))
        await eventually(lambda: dead_lettered(users), 30, "the poison entry is dead-lettered")
        for one in relays:
            one.stop()
        for worker in workers:
            worker.stop()
    return states


async def test_the_demo_runs_with_one_user_per_process_and_redis_refuses_nothing(users: Users) -> None:
    orders = {"ok": order(1), "declined": order(2, card="declined"), "no-carrier": order(3, region="nowhere")}
    states = await run_orders(users, STATELESS, orders)
    assert states == {
        "ok": SagaStatus.COMPLETED,
        "declined": SagaStatus.COMPENSATED,
        "no-carrier": SagaStatus.COMPENSATED,
    }
    operator = SagaAdmin(users.client("redsaga.operator"), stateless.app)
    assert (await operator.inspect("no-carrier", history=True)).status == SagaStatus.COMPENSATED
    assert (await operator.export("declined")).saga_id == "declined"
    assert await operator.count(status="completed") == 1
    assert [r.id for r in (await operator.list(status="compensated")).rows] == ["declined", "no-carrier"]
    assert (await operator.list(stuck_for_ms=1)).rows == []
    await operator.stats()
    letters = await operator.dead_letters()
    assert [letter.stream for letter in letters] == [ORDERS.commands("payments").key]
    await operator.dead_letter(letters[0].id, context="orders")
    assert await Versions(users.client("redsaga.operator")).status()
    await _every_ui_page_reads_as(users.client("redsaga.operator"), "no-carrier")
    assert await users.denials() == []


async def _every_ui_page_reads_as(redis: bus.Redis, saga_id: str) -> None:
    """The web UI needs no more than the read-only operator may do."""
    ui = httpx.AsyncClient(transport=httpx.ASGITransport(create_app(redis)), base_url="http://127.0.0.1")
    async with ui:
        pages = (
            "/",
            "/?stuck_for=1s",
            saga_href(saga_id),
            "/dead-letters",
            "/stats",
            "/tasks?name=managers",
            "/workers",
            "/?q=o&sort=newest&within=1h",
            f"/?q={saga_id}",
        )
        for path in pages:
            assert (await ui.get(path, follow_redirects=True)).status_code == 200, path


async def test_the_outbox_demo_replies_through_relays_running_as_the_relay_user(
    users: Users, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Payments and inventory reply through their outbox (SQLite) and a relay each; flaky
    participants make the orchestrator retry on its timers. A reply row is signed as it is
    written, by the participant's keyring from REDSAGA_KEYRING (as a participant process is
    given it); the relay holds no key."""
    await outbox_demo_as_users(users, tmp_path, monkeypatch)


async def outbox_demo_as_users(users: Users, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the outbox demo's orders with every process, relays too, as its own user."""
    stateful = ["participant:payments", "participant:inventory"]
    monkeypatch.setenv(
        KEYRING_ENV, encode_keyrings(issue_keyrings(users.master, users.reach, stateful)).decode()
    )
    ledger.dsn, stock.dsn = f"sqlite:///{tmp_path / 'payments.db'}", f"sqlite:///{tmp_path / 'inventory.db'}"
    orders = {"ok": order(1), "flaky": order(2, flaky=2), "declined": order(3, card="declined")}
    states = await run_orders(users, WITH_OUTBOX, orders, [ledger.dsn, stock.dsn])
    assert states == {
        "ok": SagaStatus.COMPLETED,
        "flaky": SagaStatus.COMPLETED,
        "declined": SagaStatus.COMPENSATED,
    }
    assert await users.denials() == []


async def denied(call: object) -> None:
    with pytest.raises(rx.NoPermissionError):
        await call  # type: ignore[misc]


async def test_a_participant_reaches_neither_the_sagas_nor_another_participants_stream(users: Users) -> None:
    orders = users.client("redsaga.orders")
    await SagaClient(orders, stateless.app.registry).start(order_fulfilment, order(1), saga_id="s1")
    payments = users.client("redsaga.orders.payments")
    await denied(payments.hgetall(ORDERS.saga("s1")))
    await denied(payments.hset(ORDERS.saga("s1"), "status", "completed"))
    await denied(payments.lrange(ORDERS.history("s1"), 0, -1))
    await denied(payments.xadd(ORDERS.commands("inventory").key, {"f": "v"}))
    await denied(payments.xreadgroup("inventory", "me", {ORDERS.commands("inventory").key: ">"}))
    await payments.hgetall("rs:{orders}:versions:shapes")  # read-only: its partition count at start
    await denied(payments.hset("rs:{orders}:versions:shapes", "order_fulfilment@1", "{}"))
    await denied(payments.get("rs:{orders:meta}:signal-secret"))
    # a function runs with the caller's permissions: it cannot reach the saga hash either
    await denied(
        payments.fcall(RECORD.function, 2, ORDERS.saga("s1"), ORDERS.saga("s1"), "g", "c", "1-0", 1, "")
    )
    # and no user runs Lua of its own, nor loads functions
    await denied(payments.eval("return 1", 0))
    await denied(payments.function_load(Library.build("test", {"mine": "return 1"}).source))
    # its own stream is allowed
    own = ORDERS.commands("payments").key
    await payments.xgroup_create(own, "payments", id="0", mkstream=True)
    assert await payments.xreadgroup("payments", "me", {own: ">"}) == []


async def test_the_operator_reads_but_cannot_write(users: Users) -> None:
    orders = users.client("redsaga.orders")
    await SagaClient(orders, stateless.app.registry).start(order_fulfilment, order(1), saga_id="s1")
    operator = users.client("redsaga.operator")
    assert (await operator.hgetall(ORDERS.saga("s1")))[b"status"] == b"running"
    await denied(operator.hset(ORDERS.saga("s1"), "status", "completed"))
    await denied(operator.xadd(ORDERS.inbox.key, {"f": "v"}))
    await denied(operator.delete(ORDERS.saga("s1")))
    await denied(operator.fcall(TRANSITION.function, 1, ORDERS.saga("s1")))
    with pytest.raises(bus.RedisPermissionDenied, match="saga acl"):
        await SagaAdmin(operator, stateless.app).cancel("s1", reason="not allowed")
    assert (await orders.hgetall(ORDERS.saga("s1")))[b"status"] == b"running"


def worker_in(context: str) -> Participant:
    """The compose sagas' ``worker`` participant for one context (one process and user each)."""
    worker = Participant("worker", serves=[context])

    @worker.handles(compose_sagas.Work)
    async def work(message: compose_sagas.Work, _ctx: CommandContext) -> compose_sagas.Worked:
        return compose_sagas.Worked(piece=message.piece)

    return worker


async def test_child_sagas_signals_sleeps_and_event_waits_run_across_context_users(
    private_redis_server: PrivateRedis,
) -> None:
    """A parent in one context runs a child in another (each orchestrator its own user); a loan
    is resumed by a signed signal, sleeps on a timer and waits for another context's event."""
    compose, lending = compose_sagas.CONTEXT, time_sagas.LENDING
    effects: list[tuple[str, str]] = []
    tokens: list[str] = []
    ledger_p, mailer_p = time_sagas.participants(effects, tokens)
    roles = {
        f"redsaga.{compose}": App("compose", sagas=[compose_sagas.parent]),
        "redsaga.billing": App("billing", sagas=[compose_sagas.invoicing]),
        f"redsaga.{compose}.worker": App("w1", participants=[worker_in(compose)]),
        "redsaga.billing.worker": App("w2", participants=[worker_in("billing")]),
        f"redsaga.{lending}": App("lending", sagas=[time_sagas.loan]),
        f"redsaga.{lending}.ledger": App("ledger", participants=[ledger_p]),
        f"redsaga.{lending}.mailer": App("mailer", participants=[mailer_p]),
    }
    whole = App(
        "all",
        sagas=[compose_sagas.parent, compose_sagas.invoicing, time_sagas.loan],
        participants=[worker_in(compose), worker_in("billing"), ledger_p, mailer_p],
    )
    async with applied(private_redis_server, whole) as users:
        workers = workers_of(users, roles)
        async with anyio.create_task_group() as tg:
            await start_all(tg, workers)
            parents = web_client(users, roles[f"redsaga.{compose}"])
            await parents.start(compose_sagas.parent, compose_sagas.Plan(id="p1"), saga_id="p1")
            loans = web_client(users, roles[f"redsaga.{lending}"])
            await loans.start(
                time_sagas.loan,
                time_sagas.Loan(id="l1", amount=5, sleep_until="2000-01-01T00:00:00+00:00"),
                saga_id="l1",
            )
            await eventually(lambda: bool(tokens), 30, "the loan waits for its signal")
            await loans.signal(tokens[0], time_sagas.Approval(approved=True, by="ops"))
            # the treasury context publishes the event the loan waits for (as its own process,
            # signing as service:treasury; an event before the wait registers is kept for it)
            events = bus.Stream.named(time_sagas.TREASURY_EVENTS)
            treasury = issue(
                users.master.secrets(), "service:treasury", sends_to=[stream_audience(events.key)]
            )
            publisher = bus.Publisher(
                users.admin,
                source="treasury",
                auth=bus.Authenticator([treasury]),
                principal="service:treasury",
            )
            await publisher.publish(events, time_sagas.FundsReady(loan_id="l1", ref="r1"))
            assert (await ended(parents, ["p1"])) == {"p1": SagaStatus.COMPLETED}
            assert (await ended(loans, ["l1"])) == {"l1": SagaStatus.COMPLETED}
            for worker in workers:
                worker.stop()
        assert effects == [("l1", "reserve"), ("l1", "disburse")]
        assert await users.denials() == []


async def test_a_worker_whose_user_lacks_its_stream_stops_with_the_permission_error(users: Users) -> None:
    """Payments' user running inventory's handlers can neither record inventory's registration
    nor create its group: the worker stops with an error that says what to do, instead of
    retrying forever."""
    worker = SagaWorker(users.client("redsaga.orders.payments"), STATELESS["redsaga.orders.inventory"])
    refused = pytest.RaisesExc(bus.RedisPermissionDenied, match="saga acl")
    with anyio.fail_after(10), pytest.RaisesGroup(refused, flatten_subgroups=True, allow_unwrapped=True):
        await worker.run()
    assert not worker.started.is_set()


async def test_a_worker_started_before_an_admin_loaded_the_functions_stops_with_the_fix(users: Users) -> None:
    """No generated user may load functions: a worker whose library is missing says how to load it
    (an orchestrator's joins the epoch with a function, before anything else)."""
    await users.admin.function_flush()
    worker = SagaWorker(
        users.client("redsaga.orders"), ORCHESTRATOR, config=users.config("orchestrator:orders")
    )
    with (
        anyio.fail_after(10),
        pytest.raises(bus.LibraryNotLoaded, match="as an admin with `saga functions load"),
    ):
        await worker.run()  # it stops in its preflight, before its task group
    assert not worker.started.is_set()


async def test_operator_writes_run_as_the_orchestrator_user(users: Users) -> None:
    """What docs/security.md promises: cancel, dead-letter requeue and purge, drain and undrain
    need no more than the context's orchestrator user (signed with an operator's keyring)."""
    await run_orders(users, STATELESS, {"ok": order(1)})  # leaves a poison entry's dead letter
    orders = users.client("redsaga.orders")
    admin = SagaAdmin(orders, stateless.app, config=users.config("operator:oncall"))
    orchestrator = SagaWorker(orders, ORCHESTRATOR, config=users.config("orchestrator:orders"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(orchestrator.run)
        await web_client(users, stateless.app).start(order_fulfilment, order(2), saga_id="c1")
        await eventually(lambda: users.admin.exists(ORDERS.saga("c1")), 30, "the orchestrator started c1")
        assert (await admin.cancel("c1", reason="fraud", wait_s=10)).outcome == "applied"
        orchestrator.stop()
    letters = bus.LetterFilter(stream="cmd:payments")
    assert len(await admin.requeue_dead_letters(letters)) == 1
    payments = SagaWorker(
        users.client("redsaga.orders.payments"),
        STATELESS["redsaga.orders.payments"],
        config=users.config("participant:payments"),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(payments.run)  # dead-letters the requeued poison entry again
        await eventually(lambda: dead_lettered(users), 30, "the requeued poison entry is dead-lettered")
        payments.stop()
    assert await admin.purge_dead_letters(letters) == 1
    versions = Versions(orders)
    await versions.drain("order_fulfilment", 1, context="orders", by="ops", reason="test")
    await versions.undrain("order_fulfilment", 1, context="orders")
    assert await users.denials() == []


async def test_the_printed_lines_pipe_into_redis_cli(private_redis_server: PrivateRedis) -> None:
    """What docs/security.md shows: ``saga acl … | redis-cli`` creates the users."""
    saga = subprocess.run(
        [sys.executable, "-m", "redsaga.cli", "acl", "--app", "redsaga.examples.all:app", "--nopass"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    cli = [str(require_binary("redis-cli")), "-p", str(private_redis_server.port)]
    piped = subprocess.run(cli, input=saga.stdout, capture_output=True, text=True, check=True, timeout=60)
    assert set(piped.stdout.split()) == {"OK"}
    admin = bus.connect(private_redis_server.url)
    try:
        names = [line.split()[1].decode() for line in await admin.execute_command("ACL", "LIST")]
    finally:
        await admin.aclose()
    assert set(names) == {u.name for u in acl_rules(demo)} | {"default"}


async def test_lock_default_leaves_only_the_generated_users_and_yours(
    private_redis_server: PrivateRedis,
) -> None:
    """``saga acl --lock-default``: once applied (after an admin user of your own exists), the
    default user can no longer log in; the generated users still can."""
    admin = bus.connect(private_redis_server.url)
    try:
        await admin.execute_command("ACL", "SETUSER", "root", "on", ">root-pw", "~*", "&*", "+@all")
        command = ["acl", "--app", "redsaga.examples.all:app", "--nopass", "--lock-default"]
        lines = subprocess.run(
            [sys.executable, "-m", "redsaga.cli", *command],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        assert lines.splitlines()[-1] == "ACL SETUSER default off"
        cli = [str(require_binary("redis-cli")), "-p", str(private_redis_server.port), "--user", "root"]
        subprocess.run(
            [*cli, "--pass", "root-pw"], input=lines, text=True, capture_output=True, check=True, timeout=60
        )
    finally:
        await admin.aclose()
    fresh = bus.connect(private_redis_server.url)  # logs in as default
    try:
        with pytest.raises(bus.BusError):
            await bus.read_epoch(fresh)
    finally:
        await fresh.aclose()
    operator = bus.connect(private_redis_server.url.replace("redis://", "redis://redsaga.operator:x@"))
    try:
        assert await bus.read_epoch(operator) is None
    finally:
        await operator.aclose()
