"""The layers' import rules (docs/architecture.md), checked on every module's imports.

An import inside ``if TYPE_CHECKING:`` does not run, so it does not count; every other
import does, wherever it is (a function-level import is still a dependency).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
FOLDERS = {"redsaga": "redsaga", "bus": "bus", "relay": "relay", "saga": "saga"}
FOLDERS |= {"cli": "redsaga.cli", "services_example": "redsaga.examples"}
"""Each source folder and the import name it ships as (redsaga/cli and redsaga/examples link
to cli/ and services_example/)."""
BARE = ("cli", "services_example")
"""The folders' own names: importable in a checkout only, never in an installed wheel."""

PURE = ("saga.errors", "saga.definition", "redsaga")
"""What the pure layers build on: no I/O, no transport."""
ALLOWED: dict[str, tuple[str, ...]] = {
    "redsaga": (),
    "bus": ("bus", "redsaga", "redis"),
    "relay": ("relay", "bus", "redsaga"),
    "saga.errors": ("saga.errors",),  # saga/errors/__init__.py draws the tree its modules define
    "saga.definition": PURE,
    "saga.core": (*PURE, "saga.core", "saga.store.codec"),
    "saga.store": (*PURE, "saga.core", "saga.store", "bus", "redsaga"),
    "saga.versions": (*PURE, "saga.core", "saga.store", "saga.versions", "bus"),
    "saga.runtime": (*PURE, "saga.core", "saga.store", "saga.versions", "saga.runtime", "bus"),
    "saga.ops": (
        *PURE,
        "saga.core",
        "saga.store",
        "saga.versions",
        "saga.runtime",
        "saga.ops",
        "bus",
        "relay",
    ),
    "saga.metrics": (*PURE, "saga.core", "saga.store", "saga.runtime", "saga.ops", "saga.metrics", "bus"),
    "saga.integrations": (*PURE, "saga.core", "saga.runtime", "saga.integrations", "bus"),
    "saga.testing": ("saga", "bus"),
    "saga.templates": (*PURE, "saga.templates", "bus"),
    "saga": ("saga", "bus"),  # saga/__init__.py and saga/_api.py: the public names
    "redsaga.cli": ("redsaga.cli", "redsaga.examples", "saga", "bus", "relay"),  # saga demo runs the example
    "redsaga.examples": ("redsaga.examples", "redsaga.cli", "saga", "bus", "relay"),
}
"""Each layer (the longest matching prefix) and the modules it may import (prefixes)."""
SHARED_PRIVATE = {("redsaga.examples", "redsaga.cli")}
"""(importer, package): the example's order generator logs as the CLI does (cli/_logging.py)."""


def modules() -> list[tuple[str, Path]]:
    found = []
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if any(p.is_symlink() for p in path.parents):
                continue  # redsaga/cli and redsaga/examples: seen under cli/ and services_example/
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found.append((".".join((name, *parts)), path))
    return found


def runtime_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import that runs (``from x import y`` may name a module ``x.y``)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for top in ast.walk(tree)
        if isinstance(top, ast.If) and "TYPE_CHECKING" in ast.unparse(top.test)
        for stmt in top.body
        for node in ast.walk(stmt)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def layer_of(module: str) -> str:
    return max((layer for layer in ALLOWED if module == layer or module.startswith(layer + ".")), key=len)


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def ours(module: str) -> bool:
    return any(under(module, p) for p in (*FOLDERS, "redis"))


def package_of(module: str) -> str:
    """The package a module belongs to: ``bus``, ``relay``, ``saga``, ``redsaga.cli``, ..."""
    return max((n for n in (*FOLDERS.values(), *BARE) if under(module, n)), key=len)


def test_every_layer_imports_only_what_it_may() -> None:
    broken = []
    for name, path in modules():
        layer = layer_of(name)
        for line, target in runtime_imports(path):
            if ours(target) and not any(under(target, allowed) for allowed in ALLOWED[layer]):
                broken.append(f"{path.relative_to(ROOT)}:{line}: {layer} imports {target}")
    assert broken == []


def test_no_package_imports_another_packages_private_modules() -> None:
    broken = []
    for name, path in modules():
        importer = package_of(name)
        for line, target in runtime_imports(path):
            if not ours(target) or under(target, "redis"):
                continue
            package = package_of(target)
            inner = target.split(".")[len(package.split(".")) : -1]
            private = any(part.startswith("_") for part in inner)
            if private and package != importer and (importer, package) not in SHARED_PRIVATE:
                broken.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert broken == []


def test_nothing_imports_the_folders_by_their_bare_names() -> None:
    """``cli`` and ``services_example`` exist only in a checkout: the wheel ships redsaga.*."""
    broken = []
    for folder in ("saga", "bus", "relay", "redsaga", *BARE, "tests", "bench", "docs", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if any(p.is_symlink() for p in path.parents):
                continue
            broken += [
                f"{path.relative_to(ROOT)}:{line}: imports {target}"
                for line, target in runtime_imports(path)
                if any(under(target, bare) for bare in BARE)
            ]
    assert broken == []


def test_the_layer_table_knows_every_saga_subpackage() -> None:
    subpackages = {p.name for p in (ROOT / "saga").iterdir() if (p / "__init__.py").exists()}
    assert {f"saga.{s}" for s in subpackages} <= set(ALLOWED)


@pytest.mark.parametrize("package", ["saga.core", "saga.definition"])
def test_the_pure_layers_load_neither_redis_nor_the_bus(package: str) -> None:
    """Importing every module of the pure core (or the definitions) loads no transport."""
    script = (
        "import importlib, pkgutil, sys\n"
        f"import {package} as package\n"
        "for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "    importlib.import_module(info.name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'bus'))\n"
        "assert not loaded, loaded\n"
        f"assert len([m for m in sys.modules if m.startswith('{package}.')]) > 3\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT)


MAX_LINES = 500
"""The longest a module of the engine's packages may be: a newcomer reads one at a sitting."""


def test_no_module_of_the_packages_is_over_500_lines() -> None:
    too_long = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for name, path in modules()
        if package_of(name) in ("saga", "bus", "relay", "redsaga.cli")
        and (lines := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert too_long == []
