"""``saga limits set|list`` on real Redis, and who may change a limit (ACL users)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import msgspec
import pytest
from typer.testing import CliRunner

import bus
from redsaga.examples.all import app as demo
from redsaga.examples.orders import order_fulfilment
from saga import App, RateLimit, SagaStatus
from saga.store.keys import LimitKeys
from saga.store.rates import read_limits, set_limit
from tests.faults.servers import PrivateRedis
from tests.security.acl_users import Users, applied
from tests.security.test_acl import STATELESS, order, run_orders

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
runner = CliRunner()
DEMO = "redsaga.examples.all:app"


async def saga(*args: str, url: str) -> tuple[int, str, str]:
    """Run ``saga limits ...`` (on a thread: the command runs its own event loop)."""
    from redsaga.cli.main import app

    result = await anyio.to_thread.run_sync(
        lambda: runner.invoke(app, ["limits", *args, "--redis-url", url], env={"USER": "alice"})
    )
    return result.exit_code, result.stdout, result.stderr


async def test_set_records_who_when_old_and_new_and_list_shows_it(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    code, out, _ = await saga("list", "--app", DEMO, "--json", url=real_redis_url)
    assert code == 0
    [payments] = msgspec.json.decode(out)
    assert (payments["name"], payments["rate"], payments["burst"]) == ("payments", 100.0, 20)
    assert (payments["declared"], payments["set_by_operator"], payments["changes"]) == (True, False, [])

    code, out, _ = await saga(
        "set", "payments", "--rate", "50/s", "--burst", "10", "--app", DEMO, url=real_redis_url
    )
    assert code == 0
    assert out.startswith("payments: 100/s burst 20 -> 50/s burst 10 (by saga limits (alice), ")
    code, out, _ = await saga(
        "set", "payments", "--rate", "3000/min", "--by", "bob", "--json", url=real_redis_url
    )
    change = msgspec.json.decode(out)
    assert (change["by"], change["old"], change["new"]) == (
        "bob",
        {"rate": 50, "burst": 10},
        {"rate": 50, "burst": 10},
    )

    code, out, _ = await saga("list", "--json", url=real_redis_url)
    [payments] = msgspec.json.decode(out)
    assert (payments["rate"], payments["burst"], payments["set_by_operator"]) == (50.0, 10, True)
    assert [c["by"] for c in payments["changes"]] == ["bob", "saga limits (alice)"]
    assert payments["tokens"] == 10  # a smaller burst drops the tokens above it
    code, out, _ = await saga("list", url=real_redis_url)
    assert "payments" in out
    assert "50/s" in out
    assert "bob" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["set", "payments"], "give --rate, --burst or both"),
        (["set", "payments", "--rate", "fast"], "write it as <number>/<s|min|h>"),
        (["set", "payments", "--burst", "0"], "burst must be a whole number"),
        (["set", "pay{ments}", "--rate", "5/s"], "invalid rate limit name"),
    ],
)
async def test_bad_input_is_a_usage_error_of_one_line(
    real_redis_url: str, args: list[str], message: str
) -> None:
    code, _, err = await saga(*args, url=real_redis_url)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1


async def test_an_undeclared_limit_needs_both_rate_and_burst(real_redis_url: str) -> None:
    code, _, err = await saga("set", "shipping", "--rate", "5/s", url=real_redis_url)
    assert code == 1
    assert "give both a rate and a burst" in err
    assert err.count("\n") == 1


async def test_a_repeated_change_is_recorded_once(real_redis: bus.Redis) -> None:
    declared = RateLimit("payments", "100/s", burst=20)
    for _ in range(2):  # redis-py re-sends a write after a lost reply: the same change id
        await set_limit(
            real_redis, "payments", rate=5.0, burst=None, declared=declared, by="x", change_id="c1"
        )
    assert await real_redis.llen(LimitKeys("payments").log) == 1


@pytest.fixture
async def users(private_redis_server: PrivateRedis) -> AsyncIterator[Users]:
    async with applied(private_redis_server, demo) as found:
        yield found


async def test_only_the_orchestrator_user_may_change_a_limit_and_the_operator_may_list(users: Users) -> None:
    """A change is an operator write, run as the orchestrator user; the read-only operator
    and a participant are refused; the operator lists the limits and their changes."""
    declared = demo.limits.by_name["payments"]
    for name in ("redsaga.operator", "redsaga.orders.payments", "redsaga.client"):
        with pytest.raises(bus.RedisPermissionDenied):
            await set_limit(
                users.client(name), "payments", rate=1.0, burst=1, declared=declared, by=name, change_id=name
            )
    users_denied = len(await users.denials())
    assert users_denied > 0
    await set_limit(
        users.client("redsaga.orders"),
        "payments",
        rate=5.0,
        burst=2,
        declared=declared,
        by="ops",
        change_id="ok",
    )
    [view] = await read_limits(users.client("redsaga.operator"), list(demo.limits))
    assert (view.rate, view.burst, [c.by for c in view.changes]) == (5.0, 2, ["ops"])
    assert len(await users.denials()) == users_denied  # the change and the list: nothing refused


async def test_signed_workers_take_tokens_as_their_own_users_and_redis_refuses_nothing(users: Users) -> None:
    """The orchestrator holds and sends the limited charges as its own ACL user, signing as
    itself; the rate timers it signs fire and are accepted; nothing is refused."""
    limited = App("orders", sagas=[order_fulfilment], limits=[RateLimit("payments", "20/s")])
    roles = {**STATELESS, "redsaga.orders": limited}
    states = await run_orders(users, roles, {f"o{n}": order(n) for n in range(4)})
    assert set(states.values()) == {SagaStatus.COMPLETED}
    assert await users.admin.zcard(LimitKeys("payments").grants) == 4  # every charge took its token
    assert await users.denials() == []
