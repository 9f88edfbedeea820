"""The vocabulary of the ACL rules: grants, users, and the commands each script calls.

``saga/ops/acl.py`` says which principal gets which grants; this module says what a grant
is, how a user's grants become ``ACL SETUSER`` rules, and which commands a Lua script needs
(read from its source, so a script that starts calling a command is granted it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final, Literal

from bus.lowlevel import shared_helpers

Role = Literal["orchestrator", "participant", "client", "tasks", "relay", "operator"]

_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z]+)')?")
_CONTAINERS: Final = frozenset({"xinfo", "xgroup", "client", "script", "object", "config"})


@dataclass(frozen=True, slots=True)
class Grant:
    """Commands allowed on keys: a user's root permissions, or one of its selectors.

    ``commands`` are ACL command names (``xgroup|create`` for a subcommand); ``keys`` are
    ACL key selectors (``~pattern`` read-write, ``%R~pattern`` read-only, ``%W~pattern``
    write-only). Redis 7 allows a command when one grant allows the command and all its keys.
    """

    commands: tuple[str, ...]
    keys: tuple[str, ...] = ()

    def selector(self) -> str:
        """The grant as an ACL selector: ``(+command ~key …)``."""
        return "(" + " ".join([*(f"+{c}" for c in self.commands), *self.keys]) + ")"


@dataclass(frozen=True, slots=True)
class AclUser:
    """One Redis ACL user: its name, what it is for, and its grants.

    The first grant is the user's root permissions, the others selectors, each binding
    commands to the only keys they may touch: a participant may ``XADD`` to the inbox it
    holds write-only, and ``XTRIM`` only its own stream.
    """

    name: str
    role: Role
    context: str | None
    grants: tuple[Grant, ...]
    note: str

    @property
    def commands(self) -> tuple[str, ...]:
        """Every command any grant allows."""
        return tuple(sorted({c for g in self.grants for c in g.commands}))

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key selector of every grant."""
        return tuple(dict.fromkeys(k for g in self.grants for k in g.keys))

    def rules(self, password: str | None) -> list[str]:
        """The ``ACL SETUSER`` arguments after the user name.

        ``password`` is stored as its SHA-256 (``#<hex>``), so the rules never hold the
        secret itself; ``None`` makes a user without a password (``nopass``), for local use.
        """
        secret = "nopass" if password is None else "#" + hashlib.sha256(password.encode()).hexdigest()
        root, *selectors = self.grants
        return [
            "reset", "on", secret, "-@all", *(f"+{c}" for c in root.commands),
            "resetkeys", *root.keys, "resetchannels", *(g.selector() for g in selectors),
        ]  # fmt: skip

    def line(self, password: str | None) -> str:
        """The ``ACL SETUSER`` line (for ``redis-cli``; selectors quoted, as it reads them)."""
        quoted = [f'"{rule}"' if rule.startswith("(") else rule for rule in self.rules(password)]
        return " ".join(["ACL", "SETUSER", self.name, *quoted])


def grant(plain: Iterable[str], scripts: Iterable[tuple[str, str]], keys: Iterable[str]) -> Grant:
    """A grant of ``plain`` commands and those ``scripts`` call, on ``keys``."""
    return Grant(commands(plain, scripts), unique(keys))


def commands(plain: Iterable[str], scripts: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """``plain`` and every command ``scripts`` call, sorted, each once."""
    called = [c for package, name in scripts for c in script_commands(package, name)]
    return tuple(sorted(set(plain) | set(called)))


@cache
def script_commands(package: str, name: str) -> tuple[str, ...]:
    """Every command ``<package>/lua/<name>.lua`` calls, as ACL names (``xinfo|groups``).

    The shared helpers it calls (``bus/lua/_shared.lua``) count as its own code.
    """
    source = (resources.files(package) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
    source += shared_helpers(source)
    found = set()
    for called, sub in _CALL.findall(source):
        command = called.lower()
        found.add(f"{command}|{sub.lower()}" if command in _CONTAINERS and sub else command)
    return tuple(sorted(found))


def unique(items: Iterable[Any]) -> Any:
    """``items`` without repeats, in order."""
    return tuple(dict.fromkeys(items))


def as_json(users: Iterable[AclUser], passwords: Mapping[str, str | None]) -> list[dict[str, object]]:
    """The users as JSON-ready dicts (``rules`` is the ``ACL SETUSER`` argument list)."""
    return [
        {
            "name": u.name,
            "role": u.role,
            "context": u.context,
            "note": u.note,
            "rules": u.rules(passwords[u.name]),
        }
        for u in users
    ]
