"""``saga functions load|list|prune`` end to end on a private ``redis-server`` (each command
its own connection, like a shell; the server is private because prune deletes every other
redsaga library on it)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from typer.testing import CliRunner

import bus
from bus._scripts import Library, load_libraries, loaded_libraries
from redsaga.cli._functions import libraries
from redsaga.cli.main import app
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.redis]
runner = CliRunner()
OLD = Library.build("bus", {"ack": "return 'an older release'"})
"""Another release's bus library."""


async def saga(*args: str, url: str | None) -> tuple[int, str, str]:
    """Run ``saga functions ...`` (on a thread: the command runs its own event loop)."""
    options = ["--redis-url", url] if url else []
    result = await anyio.to_thread.run_sync(
        lambda: runner.invoke(app, ["functions", *args, *options], env={bus.URL_ENV: None})
    )
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
async def admin(private_redis_server: PrivateRedis) -> AsyncIterator[bus.Redis]:
    client = bus.connect(private_redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


async def names_on(redis: bus.Redis) -> set[str]:
    return {loaded.name for loaded in await loaded_libraries(redis)}


async def test_load_loads_this_release_once(private_redis_server: PrivateRedis, admin: bus.Redis) -> None:
    url = private_redis_server.url
    code, out, _ = await saga("load", "--json", url=url)
    assert code == 0
    rows = json.loads(out)["libraries"]
    assert [(r["name"], r["package"], r["loaded_now"]) for r in rows] == [
        (lib.name, lib.package, True) for lib in libraries()
    ]
    assert await names_on(admin) == {lib.name for lib in libraries()}
    code, out, _ = await saga("load", url=url)
    assert code == 0
    assert out.splitlines() == [f"{lib.name}  loaded already" for lib in libraries()]


async def test_list_shows_every_release_and_what_this_one_misses(
    private_redis_server: PrivateRedis, admin: bus.Redis
) -> None:
    bus_library = libraries()[0]
    await load_libraries(admin, [OLD, bus_library])
    code, out, _ = await saga("list", "--json", url=private_redis_server.url)
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)["libraries"]}
    assert rows[OLD.name] == {
        "name": OLD.name,
        "package": "bus",
        "version": OLD.version,
        "functions": [OLD.script("ack").function],
        "this_release": False,
        "loaded": True,
    }
    assert rows[bus_library.name]["this_release"]
    assert rows[bus_library.name]["loaded"]
    assert len(rows[bus_library.name]["functions"]) == len(bus_library.scripts)
    missing = [lib for lib in libraries() if lib is not bus_library]
    assert all(rows[lib.name]["loaded"] is False and rows[lib.name]["functions"] == [] for lib in missing)
    code, out, _ = await saga("list", url=private_redis_server.url)
    assert code == 0
    assert out.splitlines()[0].split() == ["library", "package", "functions", "this", "release", "loaded"]
    assert f"{OLD.name}    bus      1          no            yes" in out


async def test_prune_deletes_other_releases_only_when_confirmed(
    private_redis_server: PrivateRedis, admin: bus.Redis
) -> None:
    url = private_redis_server.url
    await load_libraries(admin, [OLD, *libraries()])
    code, out, err = await saga("prune", url=url)
    assert code == 1
    assert err == (
        f"error: pruning deletes the libraries of other releases ({OLD.name}); their processes fail "
        "every call afterwards: pass --yes once none runs; nothing deleted\n"
    )
    assert OLD.name in await names_on(admin)
    code, out, _ = await saga("prune", "--yes", "--json", url=url)
    assert code == 0
    assert json.loads(out) == {"deleted": [OLD.name], "kept": sorted(lib.name for lib in libraries())}
    assert await names_on(admin) == {lib.name for lib in libraries()}
    code, out, _ = await saga("prune", url=url)  # nothing left to delete: no confirmation needed
    assert (code, out.startswith("kept this release's")) == (0, True)


async def test_prune_refuses_when_this_release_is_not_loaded(
    private_redis_server: PrivateRedis, admin: bus.Redis
) -> None:
    """An older CLI (or one run before ``load``) would delete the workers' libraries."""
    await load_libraries(admin, [OLD])
    code, _, err = await saga("prune", "--yes", url=private_redis_server.url)
    assert code == 1
    assert "this release's libraries are not loaded" in err
    assert "nothing deleted" in err
    assert await names_on(admin) == {OLD.name}


async def test_load_as_a_user_that_may_not_load_functions_says_so_in_one_line(
    private_redis_server: PrivateRedis, admin: bus.Redis
) -> None:
    await admin.execute_command("ACL", "SETUSER", "worker", "on", "nopass", "+@all", "-function|load")
    url = private_redis_server.url.replace("redis://", "redis://worker:x@")
    code, out, err = await saga("load", url=url)
    assert (code, out) == (1, "")
    assert err == (
        "error: this Redis user may not load functions (it needs function|load): run it as an admin user\n"
    )


async def test_the_commands_need_a_redis_and_document_their_json() -> None:
    code, _, err = await saga("list", url=None)
    assert code == 2  # a usage error, as for every command that needs a Redis
    assert err.startswith("error: no Redis to use: pass --redis-url URL or set REDSAGA_REDIS_URL")
    for command in ("load", "list", "prune"):
        code, out, _ = await saga(command, "--help", url=None)
        assert code == 0
        assert "--json" in out
        assert "--redis-url" in out
    code, _, _ = await saga("load", "--no-such-option", url=None)
    assert code == 2


async def test_the_operations_page_runs_and_shows_the_json_the_commands_print(
    private_redis_server: PrivateRedis, admin: bus.Redis
) -> None:
    """docs/operations.md's functions section: its commands run, its ``--json`` shapes are theirs."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = page.partition("## Redis Functions:")[2].partition("\n## ")[0]
    [block] = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    commands = [
        shlex.split(line.partition("#")[0]) for line in block.splitlines() if line.startswith("saga ")
    ]
    assert [c[:2] for c in commands] == [["saga", "functions"]] * 2
    for command in commands:
        code, _, err = await saga(*command[2:-2], url=private_redis_server.url)
        assert code == 0, err
    await load_libraries(admin, [OLD])
    shown = {
        "load": ("libraries", '"name", "package", "version", "loaded_now"'),
        "list": ("libraries", '"name", "package", "version", "functions", "this_release", "loaded"'),
    }
    flat = " ".join(section.split())
    for command, (key, fields) in shown.items():
        assert f'`{command}` gives `{{"{key}": [{{{fields}}}]}}`' in flat
        code, out, _ = await saga(command, "--json", url=private_redis_server.url)
        assert code == 0
        assert [list(row) for row in json.loads(out)[key]] == [json.loads(f"[{fields}]")] * len(
            json.loads(out)[key]
        )
    assert '`prune` gives `{"deleted": [...], "kept": [...]}`' in flat
    code, out, _ = await saga("prune", "--yes", "--json", url=private_redis_server.url)
    assert list(json.loads(out)) == ["deleted", "kept"]
