"""Lua scripts: loaded from ``.lua`` files once, called by SHA, reloaded on ``NOSCRIPT``.

The script cache is empty after a Redis restart or ``SCRIPT FLUSH``; a call that meets
``NOSCRIPT`` runs again with ``EVAL`` and the source (which caches it again), which is safe
because the first call did not run. ``SCRIPT LOAD`` then ``EVALSHA`` would not do: another
flush between the two fails the call. In a pipeline only the calls that met ``NOSCRIPT``
are re-sent (in one more round trip); the others ran and must not run twice. A batch may
also carry plain read commands (:class:`CommandCall`), so that a read shares the round trip.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis import exceptions as rx

from bus._client import Redis
from bus._config import BusConfig
from bus._connection import send_batch
from bus._errors import BusError, ReplicaAckTimeout, redis_errors, translate

Arg = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script, identified by its SHA1."""

    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, package: str, name: str) -> Script:
        """Read ``<package>/lua/<name>.lua``."""
        source = (resources.files(package) / "lua" / f"{name}.lua").read_text(encoding="utf-8")
        return cls(name=name, source=source, sha=hashlib.sha1(source.encode()).hexdigest())  # noqa: S324 - Redis names scripts by SHA1

    async def __call__(self, client: Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """Run the script on ``client``; redis-py errors are raised as :class:`BusError`."""
        with redis_errors():
            try:
                return await client.evalsha(self.sha, len(keys), *keys, *args)
            except rx.NoScriptError:
                return await client.eval(self.source, len(keys), *keys, *args)

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
        return self.script.sha, self.shared_keys, self.shared_args


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

    Connection errors for the whole batch are raised; per-call script errors are returned in
    place so one bad call does not hide the others' results. With ``acks`` a ``WAIT`` ends
    the pipeline (and the re-sent calls' pipeline after a ``NOSCRIPT``); when too few
    replicas acknowledged, every call that succeeded gets :class:`~bus.ReplicaAckTimeout`.
    """
    tail = [acks.command] if acks else []
    results: list[Any] = await _pipeline(client, [*calls, *tail])
    acked = results.pop() if acks else 0
    missing = [index for index, result in enumerate(results) if isinstance(result, rx.NoScriptError)]
    if missing:
        retried = await _pipeline(client, [*(calls[index] for index in missing), *tail], by_source=True)
        acked = retried.pop() if acks else 0
        for index, result in zip(missing, retried, strict=True):
            results[index] = result
    results = [translate(result) if isinstance(result, rx.RedisError) else result for result in results]
    if acks and (isinstance(acked, rx.RedisError) or acked < acks.replicas):
        late = ReplicaAckTimeout(
            0 if isinstance(acked, rx.RedisError) else acked, acks.replicas, acks.timeout_ms
        )
        results = [result if isinstance(result, BusError) else late for result in results]
    return results


async def _pipeline(client: Redis, calls: Sequence[Call], *, by_source: bool = False) -> list[Any]:
    commands = [
        call.args
        if isinstance(call, CommandCall)
        else (
            "EVAL" if by_source else "EVALSHA",
            call.script.source if by_source else call.script.sha,
            len(call.keys),
            *call.keys,
            *call.args,
        )
        for call in calls
    ]
    with redis_errors():
        return await send_batch(client, commands)
