"""One owner of the Redis schema: every key built in saga/store/keys/, every script loaded once."""

from __future__ import annotations

import ast
from importlib import resources
from pathlib import Path

from bus import Stream
from saga.store.keys import ContextKeys, Partition, PartitionKeys
from saga.store.scripts import PACKAGE, SCRIPTS

SAGA = Path(__file__).resolve().parents[2] / "saga"


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(SAGA.parent)), ast.parse(p.read_text())) for p in sorted(SAGA.rglob("*.py"))]


def _names_used(tree: ast.Module) -> set[str]:
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    return used | {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}


def test_every_key_is_built_in_the_keys_module() -> None:
    builders = [m for m, tree in _modules() if "tagged_key" in _names_used(tree)]
    assert builders == [f"saga/store/keys/{name}.py" for name in ("flow", "indexes", "partitions")]


def test_every_script_is_loaded_in_one_place() -> None:
    files = resources.files(PACKAGE) / "lua"
    lua = {f.name.removesuffix(".lua") for f in files.iterdir() if f.name.endswith(".lua")}
    assert {s.name for s in SCRIPTS} == {n for n in lua if not n.startswith("_")}
    loaders = [
        m
        for m, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "load"
        if getattr(node.value, "id", "") == "Script"
    ]
    assert loaders == ["saga/store/scripts.py"] * len(SCRIPTS)


def test_prefixes_a_script_derives_keys_from_are_the_keys_prefixes() -> None:
    partition = Partition("orders", 3)
    assert partition.saga_prefix + "s-1" == partition.saga("s-1")
    assert partition.status_prefix + "running" == partition.by_status("running")


def test_a_glob_for_the_tag_gives_the_pattern_of_the_same_keys() -> None:
    glob = PartitionKeys("orders:[0-9]")
    assert glob.saga("*") == "rs:{orders:[0-9]}:saga:*"
    assert glob.dead_letters == Partition("orders", 0).dead_letters.replace(":0}", ":[0-9]}")
    keys = ContextKeys("orders")
    index = keys.waits_on(Stream("shop", "events"))
    assert index.waits("k") == "rs:{orders:w:shop/events}:wait:k"
    assert index.early("k") == "rs:{orders:w:shop/events}:early:k"
    assert keys.schedules.all() == [f"rs:{{orders:sched}}:{n}" for n in ("specs", "states", "revs", "due")]
    assert (keys.signal_secret, keys.token_keys) == (
        "rs:{orders:meta}:signal-secret",
        "rs:{orders:meta}:token-keys",
    )


def test_a_partition_compares_by_context_and_index() -> None:
    assert Partition("orders", 1) == Partition(context="orders", index=1)
    assert len({Partition("orders", 1), Partition("orders", 1), Partition("orders", 2)}) == 2
    assert repr(Partition("orders", 1)) == "Partition(context='orders', index=1)"
