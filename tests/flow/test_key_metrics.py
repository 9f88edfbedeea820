"""The concurrency keys' metrics: per key name, never per value or saga."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import msgspec
import pytest
from typer.testing import CliRunner

import bus
from bus import FakeClock
from saga import EngineConfig, Key, SagaClient, SagaWorker
from saga.metrics import METRICS, WorkerMetrics
from tests.flow.key_sagas import LOG, Withdrawal, bank, withdrawal_saga
from tests.metrics.scrape import parse, value

pytestmark = pytest.mark.anyio
CONFIG = EngineConfig(auth=bus.SIGNING_OFF)


@pytest.fixture(autouse=True)
def fresh_log() -> Iterator[None]:
    LOG.clear()
    yield
    LOG.clear()


async def test_asks_slots_in_use_and_the_line_are_exported_per_key(real_redis: bus.Redis) -> None:
    clock = FakeClock()
    saga = withdrawal_saga(Key(lambda d: d.account))
    worker = SagaWorker(real_redis, bank(saga, with_ledger=False), config=CONFIG, clock=clock)
    metrics = WorkerMetrics(worker)
    client = SagaClient(real_redis, worker.app.registry, config=CONFIG, clock=clock)
    for account in ("a", "b"):
        for n in range(3):
            await client.start(saga, Withdrawal(account), saga_id=f"{account}{n}")
    await worker.run_until_idle()
    await client.cancel("a2", reason="test")  # it leaves its line
    await worker.run_until_idle()
    clock.advance(5.0)  # every saga in line looks again (the starts' asks were the client's)
    await worker.run_until_idle()
    samples = parse((await metrics.exposition()).decode())
    assert value(samples, "redsaga_concurrency_slots_in_use", key="withdraw") == 2  # a0 and b0
    assert value(samples, "redsaga_concurrency_waiting", key="withdraw") == 3  # a1, b1, b2
    assert value(samples, "redsaga_concurrency_lines", key="withdraw") == 2
    assert value(samples, "redsaga_concurrency_asks_total", key="withdraw", outcome="queued") == 3
    assert value(samples, "redsaga_concurrency_released_total", key="withdraw", what="released") == 1
    exported = {name for name, _ in samples}
    assert exported <= {sample for spec in METRICS for sample in spec.samples}
    labelled = [labels for name, labels in samples if name.startswith("redsaga_concurrency")]
    assert all(set(dict(labels)) <= {"key", "outcome", "what"} for labels in labelled)  # no value, no saga


async def test_saga_limits_lines_shows_each_value_its_holders_and_its_line(
    real_redis: bus.Redis, real_redis_url: str
) -> None:
    clock = FakeClock()
    saga = withdrawal_saga(Key(lambda d: d.account))
    worker = SagaWorker(real_redis, bank(saga, with_ledger=False), config=CONFIG, clock=clock)
    client = SagaClient(real_redis, worker.app.registry, config=CONFIG, clock=clock)
    for n in range(3):
        await client.start(saga, Withdrawal("acct-a"), saga_id=f"a{n}")
    await client.start(saga, Withdrawal("acct b/with spaces"), saga_id="b0")
    await worker.run_until_idle()

    code, out, _ = await limits("lines", "bank", "--json", url=real_redis_url)
    assert code == 0
    lines = {line["value"]: line for line in msgspec.json.decode(out)}
    assert (lines["acct-a"]["holders"], lines["acct-a"]["waiting"]) == (["a0"], 2)
    [hashed] = [v for v in lines if v != "acct-a"]  # a value unsafe in a key is a digest there
    assert hashed.startswith("h.")
    assert lines[hashed]["holders"] == ["b0"]
    code, out, _ = await limits("lines", "bank", "--key", "nothing", url=real_redis_url)
    assert (code, out.splitlines()[1:]) == (0, ["(none)"])
    code, _, _ = await limits("lines", url=real_redis_url)
    assert code == 2  # the context is required


async def limits(*args: str, url: str) -> tuple[int, str, str]:
    """Run ``saga limits ...`` (on a thread: the command runs its own event loop)."""
    from redsaga.cli.main import app

    result = await anyio.to_thread.run_sync(
        lambda: CliRunner().invoke(app, ["limits", *args, "--redis-url", url])
    )
    return result.exit_code, result.stdout, result.stderr
