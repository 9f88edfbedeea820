"""redsaga's Lua runs as Redis Functions: libraries built from the ``.lua`` files, loaded on
first use, named by their hash so that two releases coexist, and refused with a fix when
the user may not load them (``bus/_scripts.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from importlib import resources
from typing import Any

import pytest
from redis import exceptions as rx

import bus
import bus._scripts as scripts_module
from bus._errors import FunctionMissing, LibraryExists, LibraryNotLoaded, RedisCommandError, translate
from bus._lua import ACK, DEDUPE_CLAIM, HEARTBEAT, PUBLISH, TRIM
from bus._scripts import (
    CommandCall,
    Library,
    Script,
    library,
    load_libraries,
    loaded_libraries,
    run_batch,
    shared_helpers,
)
from saga.ops.acl_grants import script_commands
from tests.faults.servers import PrivateRedis

pytestmark = [pytest.mark.anyio, pytest.mark.on_cluster]
PACKAGES = ("bus", "saga.store", "relay")


def fresh(**bodies: str) -> Library:
    """A library no Redis has seen (a unique comment changes its hash)."""
    return Library.build("test", {name: f"-- {uuid.uuid4()}\n{body}" for name, body in bodies.items()})


COUNTING = "return redis.call('INCR', KEYS[1])"  # not idempotent on purpose: a re-run shows


@pytest.mark.parametrize("package", PACKAGES)
def test_every_lua_file_is_a_function_of_its_package_library(package: str) -> None:
    files = {f.name.removesuffix(".lua") for f in (resources.files(package) / "lua").iterdir()}
    built = library(package)
    assert set(built.scripts) == {name for name in files if not name.startswith("_")}
    assert built.name == f"redsaga_{package.partition('.')[0]}_{built.version}"
    for name in built.scripts:
        assert f"redis.register_function{{function_name='rs{built.version}_{name}', flags=" in built.source
    assert Script.load(package, built.scripts[0]).function == f"rs{built.version}_{built.scripts[0]}"


async def test_every_library_loads(redis: bus.Redis) -> None:
    """FUNCTION LOAD compiles the whole library: a syntax error or a global would refuse it."""
    await redis.function_flush()  # the test session's own server: other tests load theirs again
    assert await load_libraries(redis, [library(p) for p in PACKAGES]) == [True, True, True]
    assert {loaded.name for loaded in await loaded_libraries(redis)} == {library(p).name for p in PACKAGES}


def test_a_library_is_named_by_a_hash_of_its_text() -> None:
    one = Library.build("test", {"a": "return 1", "b": "return 2"})
    assert Library.build("test", {"b": "return 2", "a": "return 1"}) == one
    other = Library.build("test", {"a": "return 1", "b": "return 3"})
    assert (other.name, other.version) != (one.name, one.version)
    assert other.script("a").function != one.script("a").function
    with pytest.raises(ValueError, match="no script 'c' in test/lua"):
        one.script("c")


async def test_a_library_is_loaded_on_first_use(redis: bus.Redis) -> None:
    lib = fresh(echo="return ARGV[1]")
    assert lib.name not in {loaded.name for loaded in await loaded_libraries(redis)}
    assert await lib.script("echo")(redis, [], ["hello"]) == b"hello"
    [loaded] = [loaded for loaded in await loaded_libraries(redis) if loaded.name == lib.name]
    assert loaded.functions == (lib.script("echo").function,)


async def test_loading_is_idempotent(redis: bus.Redis) -> None:
    lib = fresh(echo="return ARGV[1]")
    assert await load_libraries(redis, [lib]) == [True]
    assert await load_libraries(redis, [lib]) == [False]  # "already exists" is success


async def test_only_the_calls_that_met_the_missing_library_are_sent_again(
    redis: bus.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded, missing = fresh(count=COUNTING), fresh(count=COUNTING)
    await load_libraries(redis, [loaded])
    sent: list[list[tuple[Any, ...]]] = []
    send_batch = scripts_module.send_batch

    async def recording(client: bus.Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        sent.append(list(commands))
        return await send_batch(client, commands)

    monkeypatch.setattr(scripts_module, "send_batch", recording)
    calls = [
        loaded.script("count").call(["a"], []),
        missing.script("count").call(["b"], []),
        CommandCall(("INCR", "c")),
        missing.script("count").call(["b"], []),
    ]
    assert await run_batch(redis, calls) == [1, 1, 1, 2]
    assert [await redis.get(key) for key in "abc"] == [b"1", b"2", b"1"]  # nothing ran twice
    [_, again] = sent
    function = missing.script("count").function
    assert again == [("FUNCTION", "LOAD", missing.source), *[("FCALL", function, 1, "b")] * 2]


async def test_two_releases_libraries_coexist_and_each_calls_its_own(redis: bus.Redis) -> None:
    old = Library.build("bus", {"version": "return 'old'", "same": "return 0"})
    new = Library.build("bus", {"version": "return 'new'", "same": "return 0"})
    assert await load_libraries(redis, [old, new]) == [True, True]
    assert await run_batch(
        redis, [new.script("version").call([], []), old.script("version").call([], [])]
    ) == [
        b"new",
        b"old",
    ]
    assert {old.name, new.name} <= {loaded.name for loaded in await loaded_libraries(redis)}


async def test_a_user_that_may_not_load_functions_gets_the_fix(private_redis_server: PrivateRedis) -> None:
    admin = bus.connect(private_redis_server.url)
    await admin.execute_command(
        "ACL", "SETUSER", "worker", "on", "nopass", "+hello", "+client|setname", "+fcall", "+incr", "~*"
    )
    worker = bus.connect(private_redis_server.url.replace("redis://", "redis://worker:x@"))
    loaded, missing = fresh(count=COUNTING), fresh(count=COUNTING)
    try:
        await load_libraries(admin, [loaded])
        results = await run_batch(
            worker, [loaded.script("count").call(["a"], []), missing.script("count").call(["b"], [])]
        )
        assert results[0] == 1  # the call whose library is loaded ran
        assert isinstance(results[1], LibraryNotLoaded)
        assert isinstance(results[1], bus.RedisPermissionDenied)
        assert not results[1].retryable
        assert results[1].library == missing.name
        assert str(results[1]) == (
            f"the redsaga function library {missing.name} is not loaded on this Redis; load it as an "
            "admin with `saga functions load --redis-url …`"
        )
        with pytest.raises(LibraryNotLoaded):
            await load_libraries(worker, [missing])
        await load_libraries(admin, [missing])  # the admin step
        assert await missing.script("count")(worker, ["b"], []) == 1
    finally:
        await worker.aclose()
        await admin.aclose()


async def test_a_library_that_vanishes_at_every_load_gives_up_with_function_missing(
    redis: bus.Redis, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded: a call does not loop forever against a Redis that keeps losing its functions."""
    if backend == "cluster":
        pytest.skip("a cluster batch loads on every master before the calls: a FLUSH cannot land between")
    lib = fresh(count=COUNTING)
    send_batch = scripts_module.send_batch

    async def flushed_after_each_load(client: bus.Redis, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        loads = [command for command in commands if command[:2] == ("FUNCTION", "LOAD")]
        replies = await send_batch(client, [*loads, ("FUNCTION", "FLUSH"), *commands[len(loads) :]])
        del replies[len(loads)]
        return replies

    monkeypatch.setattr(scripts_module, "send_batch", flushed_after_each_load)
    [result] = await run_batch(redis, [lib.script("count").call(["n"], [])])
    assert isinstance(result, FunctionMissing)
    assert await redis.get("n") is None


@pytest.mark.redis
async def test_at_maxmemory_only_the_functions_that_never_grow_memory_run(private_redis: bus.Redis) -> None:
    """Redis refuses an unflagged function as a whole (never part-way); acks, heartbeats and
    trims are flagged ``allow-oom``, so workers keep and finish what they hold."""
    stream = bus.Stream.named("oom")
    await private_redis.xgroup_create(stream.key, "g", id="0", mkstream=True)
    await load_libraries(private_redis, [library("bus")])
    held = (await private_redis.xadd(stream.key, {"f": "v"})).decode()
    await private_redis.xreadgroup("g", "c", {stream.key: ">"})
    [claimed] = await DEDUPE_CLAIM(
        private_redis, [stream.dedupe_key("g"), stream.dedupe_expiry_key("g")], [1000, "c", 10, held, "k"]
    )
    assert claimed is None
    expires = await private_redis.zscore(stream.dedupe_expiry_key("g"), "k")
    await private_redis.config_set("maxmemory", 1)
    try:
        assert await ACK(private_redis, [stream.key, stream.failures_key("g")], ["g", "c", "1-0"]) == [0]
        assert await HEARTBEAT(private_redis, [stream.key], ["g", "c", 1000, "1-0"]) == [0]
        # a held entry's in-flight marker is extended too
        dedupe = [stream.dedupe_key("g"), stream.dedupe_expiry_key("g")]
        assert await HEARTBEAT(private_redis, [stream.key, *dedupe], ["g", "c", 60_000, held, "k"]) == [1]
        assert await private_redis.zscore(dedupe[1], "k") > expires
        assert await TRIM(private_redis, [stream.key], [1000]) == 0
        with pytest.raises(bus.RedisOutOfMemory):
            await PUBLISH(private_redis, [stream.published_key], [stream.key, "m1", 60_000, "f", "v"])
    finally:
        await private_redis.config_set("maxmemory", 0)
    assert await private_redis.exists(stream.published_key) == 0  # refused before its first write


@pytest.mark.redis
async def test_a_function_flagged_allow_oom_calls_no_command_that_grows_memory(real_redis: bus.Redis) -> None:
    flagged = [
        (package, name)
        for package in PACKAGES
        for name in library(package).scripts
        if "-- flags: allow-oom" in (resources.files(package) / "lua" / f"{name}.lua").read_text()
    ]
    assert ("bus", "heartbeat") in flagged
    # The heartbeat re-scores an in-flight marker's expiry (ZADD XX): a member it finds gets a
    # new score, nothing is added (Redis has no command that only re-scores and is not denyoom).
    rescores = {("bus", "heartbeat"): ["zadd"]}
    for package, name in flagged:
        commands = script_commands(package, name)
        info = await real_redis.execute_command("COMMAND", "INFO", *commands)
        denied = [c for c in commands if "denyoom" in info[c]["flags"]]
        assert denied == rescores.get((package, name), []), name


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("Function not found", FunctionMissing),
        ("Library 'redsaga_bus_0123abcd' already exists", LibraryExists),
        ("Function not found here", RedisCommandError),
        ("Library not found", RedisCommandError),
    ],
)
def test_function_errors_are_told_apart_in_the_one_translation_place(
    reply: str, kind: type[bus.BusError]
) -> None:
    """redis-py gives these plain ``ResponseError``s (Redis's ``ERR …`` text, prefix stripped)."""
    assert type(translate(rx.ResponseError(reply))) is kind


def test_a_script_reads_the_shared_helpers_it_calls_and_no_other() -> None:
    assert shared_helpers("local now = clock_ms()").startswith("local function clock_ms(given)")
    assert "XPENDING" not in shared_helpers("local now = clock_ms()")
    assert "XPENDING" in shared_helpers("if leased(KEYS[1], g, id, c) then")
    assert shared_helpers("return 1") == ""
