"""``saga start`` and operator actions with signing on: the command reports the orchestrator's
verdict, not that a request was sent.

The operator holds an operator keyring (``REDSAGA_KEYRING``), not the orchestrator's, so a
start is a request that the orchestrator, running in a background thread with its own
keyring, decides; an action sent without any keyring is dead-lettered as unauthenticated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import anyio
import pytest
from typer.testing import CliRunner, Result

import bus
from bus import Authenticator
from bus._auth import encode_keyrings
from redsaga.cli.main import app as cli
from redsaga.examples.orders import order_fulfilment
from saga import App, Versions
from saga.ops.keyrings import issue_keyrings, new_master, reach_of
from tests.ops.live import APP_REF, LIVE_CONFIG, background_worker, flush
from tests.ops.scenario import app as ops_app

pytestmark = pytest.mark.redis
runner = CliRunner()
MASTER = new_master()
REACH = reach_of(ops_app, operators=["oncall"])
DATA = '{"id":"%s","customer":"c","lines":[{"sku":"s","quantity":1}],"total_cents":100}'


def keyring(principal: str) -> Authenticator:
    return Authenticator(issue_keyrings(MASTER, REACH, [principal]))


def env(url: str, *, signed: bool = True) -> dict[str, str]:
    ring = encode_keyrings(keyring("operator:oncall").keyrings.values()).decode() if signed else ""
    return {
        "REDSAGA_REDIS_URL": url,
        "REDSAGA_APP": APP_REF,
        "REDSAGA_OPERATOR": "alice@ops",
        "REDSAGA_KEYRING": ring,
        "REDSAGA_VERIFY": "" if signed else "off",  # unsigned: on purpose, as an operator would say
    }


def saga(url: str, *args: str, signed: bool = True) -> Result:
    return runner.invoke(cli, list(args), env=env(url, signed=signed))


@pytest.fixture
def url(real_redis_url: str) -> Iterator[str]:
    flush(real_redis_url)
    yield real_redis_url
    flush(real_redis_url)


@pytest.fixture
def orchestrator(url: str) -> Iterator[str]:
    """The orders orchestrator, signing and verifying with its own keyring, deciding in the background."""
    config = dataclasses.replace(LIVE_CONFIG, auth=keyring("orchestrator:orders"))
    with background_worker(url, App("orders", sagas=[order_fulfilment]), bus.SystemClock(), config):
        yield url


def test_start_prints_the_id_once_the_saga_exists_and_refusals_exit_1(orchestrator: str) -> None:
    url = orchestrator
    started = saga(url, "start", "order_fulfilment", "--data", DATA % "s-1", "--id", "s-1")
    assert (started.exit_code, started.stdout) == (0, "s-1\n"), started.output
    assert saga(url, "inspect", "s-1", "--json").exit_code == 0  # it exists: no wait needed
    again = saga(url, "start", "order_fulfilment", "--data", DATA % "s-1", "--id", "s-1")
    assert (again.exit_code, again.stdout) == (0, "s-1\n")
    other = saga(
        url, "start", "order_fulfilment", "--data", (DATA % "s-1").replace("100", "7"), "--id", "s-1"
    )
    assert other.exit_code == 1
    assert other.stderr.startswith("error: saga 's-1' exists (order_fulfilment@1) with other data")

    async def drain() -> None:
        redis = bus.connect(url)
        try:
            await Versions(redis).drain("order_fulfilment", 1, context="orders", by="ops")
        finally:
            await redis.aclose()

    anyio.run(drain)
    drained = saga(url, "start", "order_fulfilment", "--data", DATA % "s-2", "--id", "s-2")
    assert drained.exit_code == 1
    assert drained.stderr.startswith("error: order_fulfilment@1 is drained: new sagas may not start on it")
    assert "no saga with id 's-2'" in saga(url, "inspect", "s-2").stderr


def test_start_without_a_deciding_orchestrator_exits_3_and_no_wait_returns_at_once(url: str) -> None:
    pending = saga(url, "start", "order_fulfilment", "--data", DATA % "s-3", "--id", "s-3", "--wait", "0.2")
    assert pending.exit_code == 3
    assert "not decided within 0.2 s: is a worker running for its context?" in pending.stderr
    sent = saga(url, "start", "order_fulfilment", "--data", DATA % "s-4", "--id", "s-4", "--no-wait")
    assert (sent.exit_code, sent.stdout) == (0, "s-4\n")


def test_an_action_dead_lettered_as_unauthenticated_says_so(orchestrator: str) -> None:
    url = orchestrator
    assert saga(url, "start", "order_fulfilment", "--data", DATA % "s-5", "--id", "s-5").exit_code == 0
    cancelled = saga(url, "cancel", "s-5", "--reason", "test", signed=False)
    assert cancelled.exit_code == 1, cancelled.output
    assert cancelled.stderr.startswith(
        "error: cancel of saga s-5 was ignored: the request was dead-lettered ("
    )
    assert "see saga dlq show " in cancelled.stderr
    assert "not decided yet" not in cancelled.output
    # without a keyring and without saying so, the command refuses before sending anything
    refused = runner.invoke(cli, ["cancel", "s-5"], env={**env(url, signed=False), "REDSAGA_VERIFY": ""})
    assert refused.exit_code == 1
    assert refused.stderr.startswith("error: signing is off: the SagaClient 'admin' would act on entries")
