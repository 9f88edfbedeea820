"""Lua scripts as Redis Functions: one library per package, called with ``FCALL``.

Each ``<package>/lua/<name>.lua`` file is one script (its header documents its keys,
arguments and reply). At import, a package's scripts become one library: the helpers of
``bus/lua/_shared.lua``, then each file's body as a function whose parameters are ``KEYS``
and ``ARGV``. One library per package, not one for all: ``bus`` cannot know the scripts
of the packages built on it, and a release that changes only the saga scripts leaves the
bus's library as it was. The library is named by a hash of its text,
``redsaga_<package>_<hash8>``, its functions ``rs<hash8>_<name>``: two releases with different
scripts load side by side during a rolling upgrade and never call each other's code.

At ``maxmemory`` Redis refuses a function as a whole before it runs (never part-way),
unless it is flagged ``allow-oom``. A script whose writes never grow memory says so in its
header (``-- flags: allow-oom``): acknowledgements, heartbeats, consumer deletion and
trimming still run, so workers keep and finish what they hold while producers are refused.

Functions survive a restart only with persistence, and ``FUNCTION FLUSH`` removes them. A
call that meets "function not found" did not run, so its library is loaded (``FUNCTION
LOAD``; one that is there already counts as loaded) and the call is sent again, in the
same pipeline as the load. In a pipeline only the calls that met the missing library are
re-sent; the others ran and must not run twice. A user that may not load functions gets
:class:`~bus.LibraryNotLoaded` for those calls: an admin loads the libraries (``saga
functions load``). A batch may also carry plain read commands (:class:`CommandCall`), so
that a read shares the round trip.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final

from redis import exceptions as rx

from bus._client import Redis
from bus._config import BusConfig
from bus._connection import send_batch
from bus._errors import (
    BusError,
    FunctionMissing,
    LibraryExists,
    LibraryNotLoaded,
    RedisPermissionDenied,
    ReplicaAckTimeout,
    redis_errors,
    translate,
)

Arg = str | bytes | int | float

LIBRARY_PREFIX: Final = "redsaga_"
"""Every redsaga library's name starts with this (``redsaga_<package>_<hash8>``)."""
LOAD_ATTEMPTS: Final = 3
"""Loads a call may meet before its "function not found" is its result: a library flushed
again between its load and the re-sent call (the two travel in one pipeline, so this takes
a flush landing between two commands of one write)."""
_HASH = "0" * 8  # where the hash goes while the text is hashed
_NAME = re.compile(rf"{LIBRARY_PREFIX}(?P<package>\w+)_(?P<version>[0-9a-f]{{8}})")
_HELPER = re.compile(r"^local function (\w+)\(", re.MULTILINE)
_COMMENT = re.compile(r"--[^\n]*")
_FLAGS = re.compile(r"^-- flags: ([a-z-]+(?:, [a-z-]+)*)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Library:
    """The Redis Functions library of one package's scripts (see the module's docstring)."""

    package: str
    name: str
    """``redsaga_<package>_<version>``."""
    version: str
    """The first 8 hex digits of the SHA-256 of the library's text."""
    source: str
    """What ``FUNCTION LOAD`` takes."""
    scripts: tuple[str, ...]

    @classmethod
    def build(cls, package: str, bodies: Mapping[str, str]) -> Library:
        """The library of ``bodies`` (script name -> Lua body), after the shared helpers.

        ``package`` is where the files live (``saga.store``); the library is named after its
        top-level package (``redsaga_saga_<hash8>``).
        """
        text = _library_text(package, _HASH, bodies)
        version = hashlib.sha256(text.encode()).hexdigest()[:8]
        owner = _owner(package)
        name = f"{LIBRARY_PREFIX}{owner}_{version}"
        return cls(owner, name, version, _library_text(package, version, bodies), tuple(sorted(bodies)))

    def script(self, name: str) -> Script:
        """The script ``name`` of this library."""
        if name not in self.scripts:
            raise ValueError(f"no script {name!r} in {self.package}/lua (has: {', '.join(self.scripts)})")
        return Script(name, _function_name(self.version, name), self)


@cache
def library(package: str) -> Library:
    """The library of ``<package>/lua/*.lua`` (files starting with ``_`` are not scripts).

    ``package`` is an import path (``bus``, ``saga.store``).
    """
    files = resources.files(package) / "lua"
    bodies = {
        entry.name.removesuffix(".lua"): entry.read_text(encoding="utf-8")
        for entry in files.iterdir()
        if entry.name.endswith(".lua") and not entry.name.startswith("_")
    }
    return Library.build(package, bodies)


def _shared() -> str:
    return (resources.files("bus") / "lua" / "_shared.lua").read_text(encoding="utf-8")


def _library_text(package: str, version: str, bodies: Mapping[str, str]) -> str:
    functions = [
        f"-- {package.replace('.', '/')}/lua/{name}.lua\n"
        f"redis.register_function{{function_name='{_function_name(version, name)}', "
        f"flags={{{_flags(body)}}}, callback=function(KEYS, ARGV)\n{body.rstrip()}\nend}}\n"
        for name, body in sorted(bodies.items())
    ]
    head = f"#!lua name={LIBRARY_PREFIX}{_owner(package)}_{version}\n-- built by bus/_scripts.py\n"
    return head + _shared() + "".join(functions)


def _owner(package: str) -> str:
    """The package a library is named after: the top level of where its files live."""
    return package.partition(".")[0]


def _flags(body: str) -> str:
    """The function flags a script's header asks for (``-- flags: allow-oom``), as a Lua list."""
    found = _FLAGS.search(body)
    return ", ".join(f"'{flag}'" for flag in found[1].split(", ")) if found else ""


def _function_name(version: str, script: str) -> str:
    return f"rs{version}_{script}"


def shared_helpers(source: str) -> str:
    """The shared helpers that ``source`` calls, directly or not (to read every command a script runs)."""
    text = _shared()
    starts = [(match.start(), match.group(1)) for match in _HELPER.finditer(text)]
    ends = [start for start, _ in starts[1:]] + [len(text)]
    helpers = {name: text[start:end] for (start, name), end in zip(starts, ends, strict=True)}
    called: set[str] = set()
    reading = _COMMENT.sub("", source)
    while True:
        found = {name for name in helpers if name not in called and re.search(rf"\b{name}\(", reading)}
        if not found:
            return "".join(body for name, body in helpers.items() if name in called)
        called |= found
        reading = _COMMENT.sub("", "".join(helpers[name] for name in found))


@dataclass(frozen=True, slots=True)
class LoadedLibrary:
    """A redsaga library found on a Redis (``FUNCTION LIST``)."""

    name: str
    package: str
    version: str
    functions: tuple[str, ...]


async def loaded_libraries(client: Redis) -> list[LoadedLibrary]:
    """The redsaga libraries loaded on ``client``'s Redis, by name (any release's).

    On a cluster, the libraries loaded on every master (one missing on a master cannot run
    the calls whose keys live there).
    """
    with redis_errors():
        listed = await client.function_list(f"{LIBRARY_PREFIX}*")
    if isinstance(listed, dict):  # a cluster: one listing per master
        per_node = [_libraries(node_listing) for node_listing in listed.values()]
        return [lib for lib in per_node[0] if all(lib in others for others in per_node[1:])]
    return _libraries(listed)


def _libraries(listed: list[Any]) -> list[LoadedLibrary]:
    found = []
    for entry in map(_fields, listed):
        name = entry[b"library_name"].decode()
        match = _NAME.fullmatch(name)
        if match is not None:
            functions = tuple(sorted(_fields(f)[b"name"].decode() for f in entry[b"functions"]))
            found.append(LoadedLibrary(name, match["package"], match["version"], functions))
    return sorted(found, key=lambda loaded: loaded.name)


def _fields(reply: Any) -> dict[bytes, Any]:
    """A ``FUNCTION LIST`` record: a flat RESP2 list of names and values, or a dict already."""
    return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))


async def delete_library(client: Redis, name: str) -> None:
    """Delete the library ``name`` (``FUNCTION DELETE``); calls of its functions fail afterwards."""
    with redis_errors():
        await client.function_delete(name)


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: a function of its package's :class:`Library`."""

    name: str
    function: str
    """The function's name in Redis, ``rs<version>_<name>``."""
    library: Library

    @classmethod
    def load(cls, package: str, name: str) -> Script:
        """The script of ``<package>/lua/<name>.lua``, in the package's library."""
        return library(package).script(name)

    async def __call__(self, client: Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """Run the script on ``client``; errors are raised as :class:`BusError`."""
        (result,) = await run_batch(client, [self.call(keys, args)])
        if isinstance(result, BusError):
            raise result
        return result

    def call(self, keys: Sequence[str], args: Sequence[Arg]) -> ScriptCall:
        """Describe a call to run later in a batch (see :func:`run_batch`)."""
        return ScriptCall(self, tuple(keys), tuple(args))


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """A script call waiting to be pipelined."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[Arg, ...]

    async def run(self, client: Redis) -> Any:
        """Run this call on its own (one round trip)."""
        return await self.script(client, self.keys, self.args)

    @property
    def command(self) -> tuple[Arg, ...]:
        """The ``FCALL`` to send."""
        return ("FCALL", self.script.function, len(self.keys), *self.keys, *self.args)


@dataclass(frozen=True, slots=True)
class CommandCall:
    """A plain command waiting to be pipelined, e.g. ``CommandCall(("HGETALL", key))``.

    Its reply is parsed as redis-py parses that command's reply (``HGETALL`` gives a dict).
    """

    args: tuple[Arg, ...]

    async def run(self, client: Redis) -> Any:
        """Run this command on its own (one round trip)."""
        with redis_errors():
            return await client.execute_command(*self.args)  # type: ignore[no-untyped-call]


Call = ScriptCall | CommandCall
"""What :func:`run_batch` sends."""


@dataclass(frozen=True, slots=True)
class BatchPart:
    """One item of a script call that is sent merged with others (see :func:`merge`).

    Parts with the same script, shared keys and shared arguments become one call, so a
    batch of completions or publishes costs one script invocation instead of one each.
    """

    script: Script
    shared_keys: tuple[str, ...]
    shared_args: tuple[Arg, ...]
    keys: tuple[str, ...]
    args: tuple[Arg, ...]

    @property
    def merge_key(self) -> tuple[str, tuple[str, ...], tuple[Arg, ...]]:
        """Parts with equal merge keys can share one call."""
        return self.script.function, self.shared_keys, self.shared_args


def merge(parts: Sequence[BatchPart]) -> ScriptCall:
    """Join parts of one merge key into one call; its reply has one element per part.

    Layout: ``KEYS`` = shared keys, then each part's keys; ``ARGV`` = shared arguments,
    then for each part its key count, its argument count and its arguments.
    """
    first = parts[0]
    keys: list[str] = list(first.shared_keys)
    args: list[Arg] = list(first.shared_args)
    for part in parts:
        keys += part.keys
        args += [len(part.keys), len(part.args), *part.args]
    return first.script.call(keys, args)


@dataclass(frozen=True, slots=True)
class ReplicaAcks:
    """Wait for ``replicas`` replicas (up to ``timeout_ms``) after a batch: ``WAIT`` in its pipeline."""

    replicas: int
    timeout_ms: int

    @property
    def command(self) -> CommandCall:
        """The ``WAIT`` that ends a pipeline."""
        return CommandCall(("WAIT", self.replicas, self.timeout_ms))


def acks_of(config: BusConfig) -> ReplicaAcks | None:
    """The replica acknowledgement ``config`` asks producers for, if any."""
    return ReplicaAcks(config.replica_acks, config.replica_ack_timeout_ms) if config.replica_acks else None


async def run_batch(
    client: Redis, calls: Sequence[Call], *, acks: ReplicaAcks | None = None
) -> list[Any | BusError]:
    """Run ``calls`` in one pipeline (one round trip); a failed call's result is its error.

    Connection errors for the whole batch are raised; per-call errors are returned in place
    so one bad call does not hide the others' results. Calls that met a library missing
    from Redis are re-sent after loading it (one more round trip; see the module's
    docstring). With ``acks`` a ``WAIT`` ends the pipeline (and each re-send's); when too
    few replicas acknowledged, every call that succeeded gets :class:`~bus.ReplicaAckTimeout`.
    """
    tail = [acks.command] if acks else []
    replies = await _pipeline(client, [*calls, *tail])
    acked = replies.pop() if acks else 0
    results = [_result(reply) for reply in replies]
    for _ in range(LOAD_ATTEMPTS):
        missing = [
            (index, call)
            for index, (call, result) in enumerate(zip(calls, results, strict=True))
            if isinstance(result, FunctionMissing) and isinstance(call, ScriptCall)
        ]
        if not missing:
            break
        acked = await _load_and_resend(client, missing, results, tail)
    if acks and (isinstance(acked, rx.RedisError) or acked < acks.replicas):
        late = ReplicaAckTimeout(
            0 if isinstance(acked, rx.RedisError) else acked, acks.replicas, acks.timeout_ms
        )
        results = [result if isinstance(result, BusError) else late for result in results]
    return results


async def load_libraries(client: Redis, libraries: Sequence[Library]) -> list[bool]:
    """Load ``libraries`` on ``client``'s Redis in one round trip; each ``False`` if it was there already.

    Safe to repeat and to race (a name is a hash of the text). Needs the ACL permission
    ``function|load``; without it raises :class:`~bus.LibraryNotLoaded`.
    """
    replies = await _pipeline(client, _load_commands(libraries))
    outcomes = [_load_outcome(lib, reply) for lib, reply in zip(libraries, replies, strict=True)]
    for outcome in outcomes:
        if isinstance(outcome, BusError):
            raise outcome
    return [outcome is True for outcome in outcomes]


async def _load_and_resend(
    client: Redis, missing: list[tuple[int, ScriptCall]], results: list[Any], tail: list[CommandCall]
) -> Any:
    """Load the libraries of the ``missing`` calls and send those again, in one pipeline.

    Their new results replace theirs in ``results``; a call whose library could not be
    loaded gets the load's error. Returns the reply of the ``tail`` (``WAIT``), if any.
    """
    libraries = list(dict.fromkeys(call.script.library for _, call in missing))
    loads = _load_commands(libraries)
    replies = await _pipeline(client, [*loads, *(call for _, call in missing), *tail])
    acked = replies.pop() if tail else 0
    outcomes = {lib: _load_outcome(lib, reply) for lib, reply in zip(libraries, replies, strict=False)}
    for (index, call), reply in zip(missing, replies[len(loads) :], strict=True):
        result, outcome = _result(reply), outcomes[call.script.library]
        results[index] = (
            outcome if isinstance(result, FunctionMissing) and isinstance(outcome, BusError) else result
        )
    return acked


def _load_commands(libraries: Sequence[Library]) -> list[CommandCall]:
    return [CommandCall(("FUNCTION", "LOAD", lib.source)) for lib in libraries]


def _load_outcome(lib: Library, reply: Any) -> bool | BusError:
    """``True`` loaded now, ``False`` loaded before, or the error (a refusal says how to load it)."""
    result = _result(reply)
    if isinstance(result, LibraryExists):
        return False
    if isinstance(result, RedisPermissionDenied):
        return _caused(LibraryNotLoaded(lib.name), result)
    return result if isinstance(result, BusError) else True


def _result(reply: Any) -> Any:
    """A reply, or the bus error for an error reply (caused by redis-py's)."""
    return _caused(translate(reply), reply) if isinstance(reply, rx.RedisError) else reply


def _caused(error: BusError, cause: BaseException) -> BusError:
    error.__cause__ = cause
    return error


async def _pipeline(client: Redis, calls: Sequence[Call]) -> list[Any]:
    commands = [call.args if isinstance(call, CommandCall) else call.command for call in calls]
    with redis_errors():
        return await send_batch(client, commands)
