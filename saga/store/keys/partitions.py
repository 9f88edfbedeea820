"""A context's partitions and context-wide keys (the builders the package documents)."""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Final

from bus import EPOCH_KEY, Stream
from bus.lowlevel import EPOCH_COPY_PATTERN, tagged_key
from saga.errors import InvalidInput
from saga.store.keys.indexes import ScheduleKeys, WaitIndexKeys

CONTEXTS: Final = tagged_key("redsaga", "contexts")
"""The set of every context with a version registry (``saga versions list`` starts here)."""

EPOCH: Final = EPOCH_KEY
"""The deployment's epoch (the bus owns it; orchestrators write it, participants read it)."""
EPOCH_COPIES: Final = EPOCH_COPY_PATTERN
"""A glob for the epoch's copies on a cluster (the bus owns them; orchestrators only)."""

MAX_ID_LENGTH: Final = 200
_ID_CHARACTERS: Final = frozenset(chr(c) for c in range(0x21, 0x7F)) - frozenset("{}*?[]\\")


def check_saga_id(saga_id: str) -> str:
    r"""``saga_id`` if it may be part of a key, else :class:`~saga.InvalidInput`.

    1-200 printable ASCII characters, none of ``{ } * ? [ ] \``: no id can move a key into
    another hash tag or match another principal's ACL pattern, and none prints control
    characters on an operator's terminal.
    """
    if (
        not isinstance(saga_id, str)
        or not 0 < len(saga_id) <= MAX_ID_LENGTH
        or not _ID_CHARACTERS.issuperset(saga_id)
    ):
        raise InvalidInput(
            f"invalid saga id {saga_id!r}: 1-{MAX_ID_LENGTH} printable ASCII characters without spaces "
            "or any of { } * ? [ ] \\"
        )
    return saga_id


def partition_of(saga_id: str, partitions: int) -> int:
    """The partition a saga id lives in: ``crc32(saga_id) % partitions``."""
    return zlib.crc32(saga_id.encode()) % partitions


class PartitionKeys:
    """The keys under one partition's hash tag (see the module's docstring).

    Built with a glob for the tag (``PartitionKeys("orders:[0-9]")``), and ``*`` for an id,
    the builders give ACL patterns matching exactly those keys.
    """

    __slots__ = ("tag",)
    tag: str
    """The hash tag ``<context>:<index>`` (or a glob matching such tags)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def saga(self, saga_id: str) -> str:
        """The hash holding a saga's state."""
        return tagged_key(self.tag, "saga", saga_id)

    def history(self, saga_id: str) -> str:
        """The list holding a saga's history."""
        return tagged_key(self.tag, "hist", saga_id)

    def branches(self, saga_id: str) -> str:
        """The hash holding the records of a saga's group branches."""
        return tagged_key(self.tag, "branches", saga_id)

    def refused_start(self, request_id: str) -> str:
        """The string saying why the orchestrator refused the start request ``request_id``."""
        return tagged_key(self.tag, "refused", request_id)

    @property
    def saga_prefix(self) -> str:
        """What :meth:`saga` puts before the id (for a script that derives saga keys from ids)."""
        return tagged_key(self.tag, "saga", "")

    @property
    def inbox(self) -> Stream:
        """The orchestrator's inbox stream for this partition."""
        return _stream(self.tag, "inbox")

    def commands(self, participant: str) -> Stream:
        """The stream of commands this partition sends to ``participant``."""
        return _stream(self.tag, f"cmd:{participant}")

    @property
    def timers(self) -> str:
        """The sorted set of pending timers (score: due time in ms)."""
        return _key(self.tag, "timers")

    @property
    def timer_data(self) -> str:
        """The hash of pending timers' signed events: like :attr:`task_tokens`, the orchestrator's alone."""
        return _private(self.tag, "timerdata")

    def by_status(self, status: str) -> str:
        """The index of sagas in ``status`` (score: when they last moved, or ended)."""
        return _key(self.tag, "idx", status)

    @property
    def status_prefix(self) -> str:
        """What :meth:`by_status` puts before the status (for a script that derives it)."""
        return _key(self.tag, "idx", "")

    @property
    def counts(self) -> str:
        """Counters of sagas per definition version and status."""
        return _key(self.tag, "counts")

    @property
    def drained(self) -> str:
        """The set of ``name@version`` that new sagas may not start on."""
        return _key(self.tag, "drained")

    @property
    def ending(self) -> str:
        """Ended sagas whose hash expires (member ``name@version|status|id``, score: when)."""
        return _key(self.tag, "ending")

    @property
    def ends(self) -> str:
        """The stream announcing each saga that ends or is dead-lettered (``saga``, ``status``)."""
        return _key(self.tag, "ends")

    @property
    def dead_letters(self) -> str:
        """The dead-letter stream of every stream in the partition (the bus writes it)."""
        return self.inbox.dlq_key

    def task(self, task_id: str) -> str:
        """The hash holding one human task."""
        return tagged_key(self.tag, "task", task_id)

    @property
    def task_tokens(self) -> str:
        """The hash of open tasks' resume tokens (the partition's slot, another prefix: see above)."""
        return _private(self.tag, "tokens")

    def tasks_for(self, assignee: str) -> str:
        """The open tasks of ``assignee`` (``role:<r>`` or ``user:<u>``), scored by due time."""
        return tagged_key(self.tag, "tasks", assignee)

    @property
    def task_timers(self) -> str:
        """The sorted set of task timers (reminders, escalation steps; score: when)."""
        return _key(self.tag, "tasktimers")

    def task_log(self, saga_id: str) -> str:
        """The list of a saga's task actions."""
        return tagged_key(self.tag, "tasklog", saga_id)

    @property
    def task_prefixes(self) -> tuple[str, str, str]:
        """What :meth:`task`, :meth:`tasks_for` and :meth:`task_log` put before the id.

        For a script that derives those keys from ids (``prune_ended.lua``).
        """
        return (
            tagged_key(self.tag, "task", ""),
            tagged_key(self.tag, "tasks", ""),
            tagged_key(self.tag, "tasklog", ""),
        )

    @property
    def everything(self) -> str:
        """A pattern matching every key of the partition (for ACL patterns and scans)."""
        return tagged_key(self.tag, "*")


@dataclass(frozen=True, slots=True, init=False)
class Partition(PartitionKeys):
    """One partition of a context: the hash tag every key of its sagas shares."""

    context: str
    index: int

    def __init__(self, context: str, index: int) -> None:
        object.__setattr__(self, "context", context)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "tag", f"{context}:{index}")


_key = functools.lru_cache(maxsize=4096)(tagged_key)
"""``tagged_key`` for a partition's fixed keys, built on every transition (cached)."""


def _private(tag: str, *parts: str) -> str:
    """``rs:private:{tag}:…``: in ``tag``'s slot, but matched by no ``rs:{tag}:*`` pattern."""
    return _key(tag, *parts).replace("rs:{", "rs:private:{", 1)


@functools.lru_cache(maxsize=4096)
def _stream(tag: str, name: str) -> Stream:
    """Streams are built on every transition; a process uses few distinct ones."""
    return Stream(tag, name)


@dataclass(frozen=True, slots=True)
class ContextKeys:
    """The context-wide keys of a context: its version registry, token keys, schedules, waits.

    Built with a glob for the context, the builders give ACL patterns.
    """

    context: str

    @property
    def shapes(self) -> str:
        """Hash: ``name@version`` -> registered shape."""
        return tagged_key(self.context, "versions", "shapes")

    @property
    def info(self) -> str:
        """Hash: ``name@version`` -> registration and drain record."""
        return tagged_key(self.context, "versions", "info")

    @property
    def drained(self) -> str:
        """Hash: ``name@version`` -> drain note."""
        return tagged_key(self.context, "versions", "drained")

    @property
    def workers(self) -> str:
        """Sorted set: worker id -> when its registration expires (ms)."""
        return tagged_key(self.context, "versions", "workers")

    @property
    def served(self) -> str:
        """Hash: worker id -> what the worker serves."""
        return tagged_key(self.context, "versions", "served")

    @property
    def participants(self) -> str:
        """Set: the names of the participants workers ran (each adds its own)."""
        return tagged_key(self.context, "versions", "participant-names")

    def participant(self, name: str) -> str:
        """String: the worker that last ran participant ``name`` (only its user writes it)."""
        return tagged_key(self.context, "versions", "participant", name)

    @property
    def versions(self) -> str:
        """A pattern matching every key of the version registry."""
        return tagged_key(self.context, "versions", "*")

    @property
    def signal_secret(self) -> str:
        """String: the generated master signal secret (signing off, none configured)."""
        return tagged_key(self._meta, "signal-secret")

    @property
    def token_keys(self) -> str:
        """Hash: key id -> the orchestrator's public token key (base64url)."""
        return tagged_key(self._meta, "token-keys")

    @property
    def meta(self) -> str:
        """A pattern matching both token keys (the secret and the public keys)."""
        return tagged_key(self._meta, "*")

    @property
    def _meta(self) -> str:
        return f"{self.context}:meta"

    @property
    def schedules(self) -> ScheduleKeys:
        """The keys of the context's schedules."""
        return ScheduleKeys(f"{self.context}:sched")

    def waits_on(self, stream: Stream) -> WaitIndexKeys:
        """The keys of the context's index of waits for events on ``stream``."""
        return WaitIndexKeys(f"{self.context}:w:{stream.tag}/{stream.name}")

    @property
    def wait_indexes(self) -> str:
        """A pattern matching every key of every index of waits of the context."""
        return tagged_key(f"{self.context}:w:*", "*")
