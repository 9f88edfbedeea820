"""What the version registry records and reports, and the pure check behind ``saga versions check``.

The records are what :class:`~saga.versions.registry.Versions` writes to and reads from
Redis (registrations, drain notes, the workers that serve each version), and the snapshots
and reports it builds from them; :func:`check_registry` compares a snapshot with the code,
without Redis, so ``saga versions check`` runs on one read from Redis or from a file.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from saga.definition.registry import Registry
from saga.definition.shape import Shape, shape_of
from saga.versions.compatibility import Change, compare_shapes
from saga.versions.rules import RULES

SNAPSHOT_FORMAT: Final = 1


class RegistrationRecord(msgspec.Struct, kw_only=True, frozen=True):
    """When a version's shape was first registered, last changed, and by which worker."""

    registered_ms: int
    updated_ms: int
    by: str = ""


class DrainNote(msgspec.Struct, kw_only=True, frozen=True):
    """Why a version is drained (no new sagas start on it)."""

    at_ms: int
    by: str = ""
    reason: str = ""


class WorkerInfo(msgspec.Struct, kw_only=True, frozen=True):
    """A live worker's registration: who it is and which definition versions it serves."""

    id: str
    app: str = ""
    serves: list[str] = msgspec.field(default_factory=list)
    host: str = ""
    pid: int = 0
    started_ms: int = 0


class ParticipantRecord(msgspec.Struct, kw_only=True, frozen=True):
    """Which worker last started running a participant for a context, and when."""

    by: str
    at_ms: int


class ContextSnapshot(msgspec.Struct, kw_only=True):
    """A context's registered shapes and in-flight sagas per ``name@version``."""

    partitions: int
    shapes: dict[str, Shape] = msgspec.field(default_factory=dict)
    in_flight: dict[str, int] = msgspec.field(default_factory=dict)


class RegistrySnapshot(msgspec.Struct, kw_only=True):
    """The version registry as a file: what ``saga versions check --snapshot`` compares with.

    ``saga versions snapshot`` writes it from Redis; CI checks a build against it without
    reaching Redis.
    """

    taken_ms: int
    contexts: dict[str, ContextSnapshot] = msgspec.field(default_factory=dict)
    format: int = SNAPSHOT_FORMAT


class VersionStatus(msgspec.Struct, kw_only=True):
    """One definition version as ``saga versions list`` shows it.

    ``counts`` holds every status (the ended ones are lifetime totals); ``in_flight`` sums
    the statuses that have not ended. ``stranded``: sagas are in flight and no live worker
    serves the version.
    """

    context: str
    saga: str
    version: int
    registered: bool
    fingerprint: str = ""
    drained: DrainNote | None = None
    workers: int = 0
    in_flight: int = 0
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    stranded: bool = False

    @property
    def key(self) -> str:
        """``name@version``."""
        return f"{self.saga}@{self.version}"


class Stranded(msgspec.Struct, kw_only=True, frozen=True):
    """Sagas in flight on a version that no running worker serves: nothing will move them."""

    context: str
    saga: str
    version: int
    in_flight: int
    counts: dict[str, int]

    def line(self) -> str:
        """One line for logs and ``saga stats``."""
        statuses = ", ".join(f"{n} {status}" for status, n in sorted(self.counts.items()))
        return (
            f"{self.saga}@{self.version} ({self.context}): {self.in_flight} sagas in flight ({statuses}) "
            "and no running worker serves this version"
        )


class Registration(msgspec.Struct, kw_only=True):
    """What :meth:`Versions.register` did: versions added, and changes applied to registered ones.

    ``replaced`` lists breaking changes accepted because nothing was in flight on the
    version (the worker logs them as warnings).
    """

    added: list[str] = msgspec.field(default_factory=list)
    changed: list[Change] = msgspec.field(default_factory=list)
    replaced: list[Change] = msgspec.field(default_factory=list)


def check_registry(snapshot: RegistrySnapshot, registry: Registry | Iterable[Any]) -> list[Change]:
    """Compare the code's definitions with registered shapes: every change, breaking or safe.

    Pure: ``saga versions check`` runs it on a snapshot read from Redis or from a file.
    Also breaking: a version the code no longer defines while it has sagas in flight (for
    saga names the code still defines; other apps may serve other sagas).
    """
    definitions = list(registry)
    changes: list[Change] = []
    for definition in definitions:
        context = snapshot.contexts.get(definition.context.name)
        registered = context.shapes.get(definition.key) if context else None
        if registered is not None:
            changes += compare_shapes(
                registered,
                shape_of(definition),
                next_version=next_version(snapshot, definitions, definition.name),
            )
    names = {d.name for d in definitions}
    served = {d.key for d in definitions}
    for context in snapshot.contexts.values():
        for key, shape in sorted(context.shapes.items()):
            in_flight = context.in_flight.get(key, 0)
            if shape.name in names and key not in served and in_flight > 0:
                changes.append(
                    Change(
                        saga=shape.name,
                        version=shape.version,
                        rule="version-dropped",
                        breaking=RULES["version-dropped"].breaking,
                        detail=f"{in_flight} sagas are in flight on it and the code no longer defines it",
                        fix="keep it until they end (drain it, then decommission it), or migrate them",
                    )
                )
    return changes


def next_version(snapshot: RegistrySnapshot, definitions: list[Any], name: str) -> int:
    """The version after the highest one ``name`` has in the code or the snapshot."""
    versions: list[int] = [int(d.version) for d in definitions if d.name == name]
    versions += [s.version for c in snapshot.contexts.values() for s in c.shapes.values() if s.name == name]
    return max(versions) + 1


def parse_key(key: str) -> tuple[str, int]:
    """Split ``name@version`` (``ValueError`` when it is not one)."""
    name, _, version = key.rpartition("@")
    if not name or not version.isdigit():
        raise ValueError(f"{key!r} is not name@version (e.g. order_fulfilment@1)")
    return name, int(version)


def worker_info(worker_id: str, app: str, serves: Iterable[str], started_ms: int) -> WorkerInfo:
    """A worker registration for this process."""
    return WorkerInfo(
        id=worker_id,
        app=app,
        serves=sorted(serves),
        host=socket.gethostname(),
        pid=os.getpid(),
        started_ms=started_ms,
    )
