"""Every Redis key the saga engine reads or writes, in one place.

Nothing else in ``saga/`` builds a key: the store, the runtime, the operator tools and the
ACL generator (``saga/ops/acl.py``) ask the builders here, and a Lua script receives its
keys from Python in ``KEYS`` (or, when it must derive a key from an id, the key's prefix in
``ARGV``, built here). The bus's own keys (streams and their companions: dedupe, failures,
lost reports, the publish window, the dead letters) are ``redsaga/streams.py``'s.

Each entry: key, type, what it holds, who writes it.

A context's sagas are spread over P partitions; every key of one partition shares the hash
tag ``{<context>:<partition>}``, so each transition is one single-slot script
(:class:`Partition`)::

    rs:{orders:0}:saga:<id>          hash: the saga's state (layout: saga/store/codec.py);
                                     transition.lua, migrate.lua
    rs:{orders:0}:hist:<id>          list: the saga's history, one MessagePack entry per
                                     event, referring to the saga hash (saga/store/history.py);
                                     transition.lua, migrate.lua
    rs:{orders:0}:branches:<id>      hash: '<group>#<index>' -> one branch's record (JSON), for
                                     sagas with group steps (saga/store/branches.py); transition.lua
    rs:{orders:0}:inbox              stream: replies, timer firings, operator requests, event
                                     deliveries, child reports; every principal adds, the
                                     orchestrator reads
    rs:{orders:0}:cmd:<participant>  stream: commands for a participant (cmd:_local: actions,
                                     cmd:_waits: event-wait registrations, cmd:_child: child
                                     sagas to start or cancel); transition.lua
    rs:{orders:0}:timers             zset: timer id -> due time (ms); transition.lua, fire_timers.lua
    rs:private:{orders:0}:timerdata  hash: timer id -> '<len>:<saga id><MAC><event JSON>'; same, private
    rs:{orders:0}:idx:<status>       zset: saga id -> when it last moved (an ended saga: when it
                                     ended); the unfinished statuses' indexes together are the
                                     sagas in flight, by staleness (``saga list --stuck-for``);
                                     transition.lua, migrate.lua, prune_ended.lua (derives it
                                     from the prefix it is given)
    rs:{orders:0}:counts             hash: '<name>@<version>|<status>' -> number of sagas;
                                     transition.lua, prune_ended.lua
    rs:{orders:0}:ending             zset: 'name@version|status|id' -> when the ended saga's hash
                                     expires; transition.lua, prune_ended.lua
    rs:{orders:0}:ends               stream: one entry per saga that ended or was dead-lettered
                                     ('saga' id, 'status'), the last 1,000 or more (~43 KB); the
                                     transition that ends it adds it; SagaClient.wait blocks
                                     on it (saga/runtime/results.py)
    rs:{orders:0}:drained            set: 'name@version' that new sagas may not start on (drain);
                                     the start transition checks it in the same script;
                                     versions drain (saga/versions/registry.py)
    rs:{orders:0}:task:<id>          hash: one human task ('rev', 'task' JSON: saga/core/task_rules.py);
                                     task_write.lua; prune_ended.lua deletes it with its saga
    rs:private:{orders:0}:tokens     hash: task id -> an open human task's resume token ('' once
                                     closed); task_write.lua, prune_ended.lua (HDEL with its
                                     saga). Outside ``rs:{orders:0}:*``, so no pattern of the
                                     operator's reaches it: the orchestrator and the task client only
    rs:{orders:0}:tasks:<assignee>   zset: open task id -> due (ms), per 'role:<r>' or 'user:<u>';
                                     task_write.lua, prune_ended.lua
    rs:{orders:0}:tasktimers         zset: '<task id>|<stage>' -> when (ms): reminders and
                                     escalation steps; task_write.lua, prune_ended.lua
    rs:{orders:0}:tasklog:<id>       list: a saga's task actions (who, what, when; JSON);
                                     task_write.lua; prune_ended.lua deletes it with its saga
    rs:{orders:0}:refused:<request>  string: why a client's start request was refused (JSON
                                     ``{"kind", "reason"}``, expiring), read by the client that
                                     waits for its verdict; the orchestrator
    rs:{orders:0}:dlq                stream: dead letters of every stream in the partition; the
                                     bus's consumers (``Stream.dlq_key``), read by ``saga dlq``

A context's definition versions are registered under the context's own hash tag
(``saga/versions/registry.py`` writes them; see docs/versioning.md; :class:`ContextKeys`)::

    rs:{orders}:versions:shapes      hash: 'name@version' -> registered shape (JSON,
                                     saga/definition/shape.py); register_shape.lua
    rs:{orders}:versions:info        hash: 'name@version' -> when and by whom it was registered;
                                     register_shape.lua
    rs:{orders}:versions:drained     hash: 'name@version' -> drain note (who, when, why); versions drain
    rs:{orders}:versions:workers     zset: worker id -> when its registration expires (ms);
                                     workers.lua
    rs:{orders}:versions:served      hash: worker id -> what the worker serves (JSON); workers.lua
    rs:{orders}:versions:participant-names  set: the participants workers ran (which
                                     cmd:<participant> streams the context has); each participant
                                     adds its own name (SADD only)
    rs:{orders}:versions:participant:<name>  string: the worker that last ran <name> (JSON);
                                     written by that participant's user alone, so a name in the
                                     set counts only with its record
    rs:{redsaga}:contexts            set: every context with a version registry; the registry

A context's schedules (``saga/runtime/schedule_runner.py``; :class:`ScheduleKeys`), one
slot per context::

    rs:{orders:sched}:specs          hash: schedule id -> Schedule (JSON); schedule_write.lua
    rs:{orders:sched}:states         hash: schedule id -> ScheduleState (JSON); schedule_write.lua
    rs:{orders:sched}:revs           hash: schedule id -> revision (compare-and-set); schedule_write.lua
    rs:{orders:sched}:due            zset: schedule id -> when to look at it next (Unix ms);
                                     schedule_write.lua

A context's index of event waits (``saga/store/wait_index.py``; :class:`WaitIndexKeys`),
one slot per (context, awaited stream)::

    rs:{orders:w:<tag>/<name>}:wait:<key>   hash: '<type> <saga>|<step>|<n>' -> waiter (JSON);
                                            watch_event.lua, the orchestrator (HDEL when it ends)
    rs:{orders:w:<tag>/<name>}:early:<key>  list: '<type> <event JSON>', events that came before
                                            their wait (capped, expiring); route_event.lua

A context's resume-token keys (``saga/store/token_keys.py``; :class:`ContextKeys`)::

    rs:{orders:meta}:signal-secret   string: the generated master secret (signing off, none
                                     configured); the first process that needs it (SET NX)
    rs:{orders:meta}:token-keys      hash: key id -> public key (base64url); the orchestrator

A rate limit's bucket (``saga/store/rates.py``; :class:`LimitKeys`), one slot per limit, so a
limit shared by every context and partition is one single-slot script on a Redis Cluster::

    rs:{limit:payments}:bucket       hash: 'tokens', 'at' (ms of the last refill), and the
                                     operator's 'rate' and 'burst' when set; rate_take.lua,
                                     rate_set.lua
    rs:{limit:payments}:grants       zset: command id -> when its token is due (ms), for the
                                     last minute (a repeated take changes nothing); rate_take.lua
    rs:{limit:payments}:log          list: the operator's changes (JSON: who, when, old, new),
                                     the last 100; rate_set.lua
    rs:{limits}:names                set: every limit a worker declared or an operator set
                                     (``saga limits list`` starts here)

The deployment's epoch (``bus/_epoch.py`` owns it; :data:`EPOCH`)::

    rs:epoch                         string: the deployment's epoch; epoch.lua (orchestrators)
    rs:{epoch:<n>}                   string: on a Redis Cluster, 64 copies of it spread over the
                                     slots, so each master holds one (:data:`EPOCH_COPIES`)

:class:`Partition` and :class:`ContextKeys` built with a glob (``PartitionKeys("orders:[0-9]")``)
give the ACL patterns matching exactly those keys, so ``saga acl`` derives every pattern here.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Final

from bus import EPOCH_KEY, Stream
from bus.lowlevel import EPOCH_COPY_PATTERN, tagged_key
from saga.errors import InvalidInput

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


LIMIT_NAMES: Final = tagged_key("limits", "names")
"""The set of every rate limit declared or set (``saga limits list`` starts here)."""


@dataclass(frozen=True, slots=True)
class LimitKeys:
    """The keys of one rate limit, under its own hash tag ``{limit:<name>}``.

    Built with ``*`` for the name, they give the ACL pattern of every limit.
    """

    name: str

    @property
    def bucket(self) -> str:
        """The bucket: its tokens, last refill and the operator's rate and burst."""
        return tagged_key(f"limit:{self.name}", "bucket")

    @property
    def grants(self) -> str:
        """Command id -> when its token is due, for the last minute."""
        return tagged_key(f"limit:{self.name}", "grants")

    @property
    def log(self) -> str:
        """The operator's changes, newest first."""
        return tagged_key(f"limit:{self.name}", "log")

    @property
    def everything(self) -> str:
        """A glob of every key of the limit (for ACL patterns)."""
        return tagged_key(f"limit:{self.name}", "*")

    def all(self) -> list[str]:
        """The keys a take, a release or a change touches, in the scripts' order."""
        return [self.bucket, self.grants, self.log]


@dataclass(frozen=True, slots=True)
class ScheduleKeys:
    """The keys of a context's schedules, in one slot (``{<context>:sched}``)."""

    tag: str

    @property
    def specs(self) -> str:
        """Hash: schedule id -> Schedule."""
        return tagged_key(self.tag, "specs")

    @property
    def states(self) -> str:
        """Hash: schedule id -> ScheduleState."""
        return tagged_key(self.tag, "states")

    @property
    def revisions(self) -> str:
        """Hash: schedule id -> revision (compare-and-set)."""
        return tagged_key(self.tag, "revs")

    @property
    def due(self) -> str:
        """Sorted set: schedule id -> when to look at it next (Unix ms)."""
        return tagged_key(self.tag, "due")

    @property
    def everything(self) -> str:
        """A pattern matching every key of the schedules."""
        return tagged_key(self.tag, "*")

    def all(self) -> list[str]:
        """The four keys, as ``schedule_write.lua`` takes them."""
        return [self.specs, self.states, self.revisions, self.due]


@dataclass(frozen=True, slots=True)
class WaitIndexKeys:
    """The keys of a context's index of waits on one stream (``{<context>:w:<stream>}``)."""

    tag: str

    def waits(self, key: str) -> str:
        """Hash: ``'<type> <saga>|<step>|<n>'`` -> waiter, the waits for correlation ``key``."""
        return tagged_key(self.tag, "wait", key)

    def early(self, key: str) -> str:
        """List: events with correlation ``key`` that came before their wait."""
        return tagged_key(self.tag, "early", key)
