"""docs/operations.md, "Autoscaling with KEDA": the ScaledObjects name what Redis reports.

The page's ``shop.py`` runs on a real Redis: sagas start in all four partitions, and every
trigger ``saga keda`` prints must name a stream and consumer group that ``XINFO GROUPS``
reports, with the lag and pending counts the page describes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import bus
from redsaga.cli._load import load_object
from redsaga.cli.main import app as cli
from saga import App, SagaClient, SagaWorker

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "operations.md").read_text()
SECTION = PAGE[PAGE.index("## Autoscaling with KEDA") :]
SECTION = SECTION[: SECTION.index("\n## ", 1)]
SHOP = re.search(r"```python\n(# shop\.py\n.*?)```", SECTION, re.DOTALL)
CONSOLE = re.search(r"```sh\nsaga (keda .*?)\n```\n\nprints\n\n```yaml\n(.*?)```", SECTION, re.DOTALL)
SAGAS = 40


@pytest.fixture
def shop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The page's ``shop.py``, importable from the current directory (as the CLI imports it)."""
    assert SHOP is not None
    (tmp_path / "shop.py").write_text(SHOP.group(1))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "shop", raising=False)
    yield tmp_path


def keda(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["keda", *args])
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(result.stdout)
    assert isinstance(manifest, dict)
    return manifest


def test_the_page_shows_what_saga_keda_prints(shop: Path) -> None:
    assert CONSOLE is not None
    command, shown = CONSOLE.group(1), CONSOLE.group(2)
    result = CliRunner().invoke(cli, command.split())
    assert result.exit_code == 0, result.output
    assert result.stdout == shown


def test_the_triggers_are_summed_and_an_orchestrator_keeps_a_replica(shop: Path) -> None:
    orders = keda("--app", "shop:orders_app", "--lag", "50")
    spec = orders["spec"]
    names = [t["name"] for t in spec["triggers"]]
    assert len(names) == 8 == len(set(names))  # inbox and _local of four partitions
    assert spec["advanced"]["scalingModifiers"]["formula"] == " + ".join(names)
    assert spec["advanced"]["scalingModifiers"]["target"] == "50"
    assert spec["minReplicaCount"] == 1
    assert all(t["metadata"]["lagCount"] == "50" for t in spec["triggers"])
    refused = CliRunner().invoke(cli, ["keda", "--app", "shop:orders_app", "--min-replicas", "0"])
    assert refused.exit_code == 2
    words = " ".join(refused.output.replace("│", " ").split())  # the usage box wraps the message
    assert "at 0 replicas no timeout, retry or sleep would fire" in words


def groups(info: list[dict[Any, Any]]) -> dict[str, dict[str, Any]]:
    """``XINFO GROUPS`` by group name, with text keys."""
    decoded = [{_text(k): v for k, v in group.items()} for group in info]
    return {_text(group["name"]): group for group in decoded}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@pytest.mark.anyio
@pytest.mark.redis
async def test_every_trigger_names_a_group_redis_reports_with_its_lag(
    shop: Path, real_redis: bus.Redis
) -> None:
    orders_app, payments_app = load_object("shop:orders_app"), load_object("shop:payments_app")
    assert isinstance(orders_app, App)
    assert isinstance(payments_app, App)
    orchestrator = SagaWorker(real_redis, orders_app)
    await orchestrator.register()
    await orchestrator.bus_worker.setup()
    await SagaWorker(real_redis, payments_app).bus_worker.setup()  # its groups, as a worker makes them
    client = SagaClient(real_redis, orders_app.registry)
    shop_module = __import__("shop")
    for n in range(SAGAS):
        await client.start("checkout", shop_module.Order(id=f"o-{n}", amount=n), saga_id=f"o-{n}")
    await orchestrator.run_until_idle()  # each saga sends its charge; no payments worker reads them

    per_partition = {
        p: len([k async for k in real_redis.scan_iter(match=f"rs:{{shop:{p}}}:saga:*")]) for p in range(4)
    }
    assert sum(per_partition.values()) == SAGAS
    assert all(per_partition.values())  # every partition has sagas, so every trigger is tried

    for trigger in keda("--app", "shop:payments_app")["spec"]["triggers"]:
        meta = trigger["metadata"]
        partition = int(re.fullmatch(r"rs:\{shop:(\d)\}:cmd:payments", meta["stream"]).group(1))  # type: ignore[union-attr]
        group = groups(await real_redis.xinfo_groups(meta["stream"]))[meta["consumerGroup"]]
        assert (group["lag"], group["pending"]) == (per_partition[partition], 0)  # the backlog is lag
    for trigger in keda("--app", "shop:orders_app")["spec"]["triggers"]:
        meta = trigger["metadata"]
        group = groups(await real_redis.xinfo_groups(meta["stream"]))[meta["consumerGroup"]]
        assert (group["lag"], group["pending"]) == (0, 0)  # the orchestrator read all it was sent

    # A consumer that takes entries moves them from lag to pending until it acknowledges them.
    stream = "rs:{shop:0}:cmd:payments"
    await real_redis.xreadgroup("payments", "probe", {stream: ">"}, count=1)
    group = groups(await real_redis.xinfo_groups(stream))["payments"]
    assert (group["lag"], group["pending"]) == (per_partition[0] - 1, 1)

    # An entry deleted before the group read it: Redis cannot tell the lag until the group
    # reads past it (KEDA's client reads the nil as 0); then it may count the deleted entry.
    unread = await real_redis.xrange(stream, count=2)
    await real_redis.xdel(stream, unread[-1][0])
    assert groups(await real_redis.xinfo_groups(stream))["payments"]["lag"] is None
    await real_redis.xreadgroup("payments", "probe", {stream: ">"}, count=per_partition[0])
    assert groups(await real_redis.xinfo_groups(stream))["payments"]["lag"] in {0, 1}  # 1 on Redis 7.0
