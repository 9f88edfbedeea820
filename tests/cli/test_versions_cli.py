"""``saga versions`` end to end on real Redis (each command is its own connection, like a shell)."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest
from typer.testing import CliRunner

import bus
from saga import SagaClient, SagaWorker, Versions
from tests.saga.versioned import V1, Order, app_migrating, app_v1

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
runner = CliRunner()


async def saga(*args: str, url: str | None = None, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``saga versions ...`` (on a thread: the command runs its own event loop)."""
    from redsaga.cli.main import app

    options = ["--redis-url", url] if url else []
    result = await anyio.to_thread.run_sync(
        lambda: runner.invoke(app, ["versions", *args, *options], env=env)
    )
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
async def registered(real_redis: bus.Redis, real_redis_url: str) -> str:
    """shop_order@1 registered by a worker serving v1 and v2, two sagas in flight on v1."""
    await SagaWorker(real_redis, app_migrating, consumer="w").register()
    client = SagaClient(real_redis, app_v1.registry)
    for saga_id in ("s1", "s2"):
        await client.start(V1, Order(id=saga_id, total=5), saga_id=saga_id)
    return real_redis_url


async def test_check_against_redis_prints_one_line_per_problem(registered: str) -> None:
    code, out, err = await saga("check", "--app", "tests.saga.versioned:app_broken", url=registered)
    assert code == 1
    assert out == "shop_order@1: step 'charge' was removed: make this version 3\n"
    assert "1 breaking" in err
    code, out, err = await saga("check", "--app", "tests.saga.versioned:app_appended", url=registered)
    assert (code, out) == (0, "")
    assert "safe: shop_order@1: step 'notify' was appended" in err


async def test_check_from_a_snapshot_needs_no_redis(registered: str, tmp_path: Path) -> None:
    file = tmp_path / "versions.json"
    code, _, _ = await saga("snapshot", "-o", str(file), url=registered)
    assert code == 0
    snapshot = msgspec.json.decode(file.read_bytes())
    assert snapshot["contexts"]["shop"]["in_flight"] == {"shop_order@1": 2}

    code, out, _ = await saga(
        "check",
        "--app",
        "tests.saga.versioned:app_broken",
        "--snapshot",
        str(file),
        "--json",
        env={bus.URL_ENV: "redis://127.0.0.1:1/0"},  # unreachable: the snapshot is all it reads
    )
    assert code == 1
    report = msgspec.json.decode(out)
    assert report["ok"] is False
    assert [c["rule"] for c in report["changes"]] == ["step-removed"]


def test_check_without_a_registry_refuses_to_pass_vacuously() -> None:
    from redsaga.cli.main import app

    result = runner.invoke(
        app, ["versions", "check", "--app", "tests.saga.versioned:app_v1"], env={bus.URL_ENV: ""}
    )
    assert result.exit_code == 1
    assert "give --redis-url (or REDSAGA_REDIS_URL)" in result.stderr


async def test_list_drain_and_decommission(registered: str, real_redis: bus.Redis) -> None:
    code, out, _ = await saga("list", url=registered)
    assert code == 0
    header, v1, v2 = out.splitlines()
    assert header.split()[:6] == ["context", "saga", "version", "state", "workers", "in"]
    assert v1.split()[:7] == ["shop", "shop_order", "1", "registered", "1", "2", "2"]
    assert v2.split()[:4] == ["shop", "shop_order", "2", "registered"]

    assert (await saga("decommission", "shop_order@1", url=registered))[0] == 1
    code, out, _ = await saga("drain", "shop_order@1", "--reason", "v2", "--by", "me", url=registered)
    assert (code, out) == (0, "shop_order@1 drained: new sagas may not start on it\n")
    code, _, err = await saga("decommission", "shop_order@1", url=registered)
    assert code == 1
    assert "error: shop_order@1 has 2 sagas in flight" in err
    code, out, _ = await saga("list", "--json", url=registered)
    [row] = [r for r in msgspec.json.decode(out) if r["version"] == 1]
    assert row["drained"]["by"] == "me"
    assert row["counts"] == {"running": 2}
    assert (await saga("undrain", "shop_order@1", url=registered))[0] == 0
    assert await Versions(real_redis).drained("shop") == {}
    code, _, err = await saga("drain", "nope@1", url=registered)
    assert (code, err.strip()) == (1, "error: nope@1 is not registered in any context")


async def test_migrate_dry_run_then_for_real(registered: str, real_redis: bus.Redis) -> None:
    args = [
        "migrate",
        "shop_order",
        "--from",
        "1",
        "--to",
        "2",
        "--app",
        "tests.saga.versioned:app_migrating",
    ]
    code, out, err = await saga(*args, "--dry-run", url=registered)
    assert code == 0
    assert out.count("would_migrate") == 2
    assert "would migrate 2, refused 0, skipped 0; 2 still in flight on shop_order@1" in err
    assert (await SagaClient(real_redis, app_migrating.registry).get("s1")).version == 1

    code, out, _ = await saga(*args, "--json", url=registered)
    assert code == 0
    report = msgspec.json.decode(out)
    assert sorted(r["outcome"] for r in report["results"]) == ["migrated", "migrated"]
    assert (await SagaClient(real_redis, app_migrating.registry).get("s1")).version == 2

    code, _, err = await saga(
        "migrate",
        "shop_order",
        "--from",
        "1",
        "--to",
        "3",
        "--app",
        "tests.saga.versioned:app_migrating",
        url=registered,
    )
    assert code == 1
    assert "has no migration shop_order@1->3" in err
