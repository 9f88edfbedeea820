"""Every Redis key the saga engine writes, in one place.

A context's sagas are spread over P partitions; every key of one partition shares the hash
tag ``{<context>:<partition>}``, so each transition is one single-slot script::

    rs:{orders:0}:saga:<id>          hash: the saga's state (see saga/store/lua/transition.lua)
    rs:{orders:0}:hist:<id>          list: the saga's history, one JSON entry per event
    rs:{orders:0}:branches:<id>      hash: '<group>#<index>' -> one branch's record (JSON), for
                                     sagas with group steps (see saga/store/branches.py)
    rs:{orders:0}:inbox              stream: replies, timer firings, operator requests
    rs:{orders:0}:cmd:<participant>  stream: commands for a participant (cmd:_local: actions,
                                     cmd:_waits: event-wait registrations, cmd:_child: child
                                     sagas to start or cancel)
    rs:{orders:0}:timers             zset: timer id -> due time (ms)
    rs:{orders:0}:timerdata          hash: timer id -> '<len>:<saga id><event JSON>'
    rs:{orders:0}:idx:<status>       zset: saga id -> time it entered the status
    rs:{orders:0}:active             zset: saga id -> time it last moved (non-terminal only)
    rs:{orders:0}:counts             hash: '<name>@<version>|<status>' -> number of sagas
    rs:{orders:0}:dlq                stream: dead letters of every stream in the partition
    rs:{orders:0}:drained            set: 'name@version' that new sagas may not start on (drain);
                                     the start transition checks it in the same script

A context's definition versions are registered under the context's own hash tag
(``saga/versions/registry.py`` writes them; see docs/versioning.md)::

    rs:{orders}:versions:shapes      hash: 'name@version' -> registered shape (JSON, saga/definition/shape.py)
    rs:{orders}:versions:info        hash: 'name@version' -> when and by whom it was registered
    rs:{orders}:versions:drained     hash: 'name@version' -> drain note (who, when, why)
    rs:{orders}:versions:workers     zset: worker id -> when its registration expires (ms)
    rs:{orders}:versions:served      hash: worker id -> what the worker serves (JSON)
    rs:{orders}:versions:participants hash: participant -> the worker that last ran it (JSON):
                                     which cmd:<participant> streams the context has
    rs:{redsaga}:contexts            set: every context with a version registry
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from typing import Final

from bus import Stream
from bus.lowlevel import tagged_key
from saga.errors import InvalidInput

CONTEXTS: Final = tagged_key("redsaga", "contexts")
"""The set of every context with a version registry (``saga versions list`` starts here)."""


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


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of a context: the hash tag every key of its sagas shares."""

    context: str
    index: int
    tag: str = field(init=False, repr=False, compare=False)
    """The hash tag ``<context>:<index>``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tag", f"{self.context}:{self.index}")

    def saga(self, saga_id: str) -> str:
        """The hash holding a saga's state."""
        return tagged_key(self.tag, "saga", saga_id)

    def history(self, saga_id: str) -> str:
        """The list holding a saga's history."""
        return tagged_key(self.tag, "hist", saga_id)

    def branches(self, saga_id: str) -> str:
        """The hash holding the records of a saga's group branches."""
        return tagged_key(self.tag, "branches", saga_id)

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
        """The hash of pending timers' events."""
        return _key(self.tag, "timerdata")

    def by_status(self, status: str) -> str:
        """The index of sagas in ``status`` (score: when they entered it)."""
        return _key(self.tag, "idx", status)

    @property
    def active(self) -> str:
        """The index of non-terminal sagas by last movement (for ``--stuck-for``)."""
        return _key(self.tag, "active")

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


_key = functools.lru_cache(maxsize=4096)(tagged_key)
"""``tagged_key`` for a partition's fixed keys, built on every transition (cached)."""


@functools.lru_cache(maxsize=4096)
def _stream(tag: str, name: str) -> Stream:
    """Streams are built on every transition; a process uses few distinct ones."""
    return Stream(tag, name)


@dataclass(frozen=True, slots=True)
class ContextKeys:
    """The keys of a context's version registry (hash tag ``{<context>}``)."""

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
        """Hash: participant name -> the worker that last ran it."""
        return tagged_key(self.context, "versions", "participants")
