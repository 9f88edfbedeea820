"""Redis ACL users for an app: each process gets only its own keys and the commands it sends.

:func:`acl_rules` derives the users from the app's definitions and the key layout
(``saga/store/keys/``, ``redsaga/streams.py``), never from a hand-kept list of keys. They assume
signing is on (``bus/_auth.py``): a client then starts sagas by a signed request on the
inbox instead of writing them, and a parent saga starts its children in another context the
same way, so neither needs to write a saga::

    user                            may                                        may not
    <prefix>.<context>              every key of its partitions, its event     anything of another
      (orchestrator)                waits, schedules, token keys, versions,    context but what a
                                    rs:epoch; add to the inbox of a child's    child or parent needs
                                    or parent's context, read a child's saga
    <prefix>.<context>.<p>          its command stream and group, its dedupe,  read the inbox or the
      (participant)                 failure and lost-report records; add       dead letters, delete,
                                    replies to the inbox and letters to the    trim or ack them, write
                                    dead-letter stream (write-only); read      rs:epoch, reach another
                                    rs:epoch and the registered shapes         participant's stream
    <prefix>.client                 add to the inboxes (start requests,        write or delete a saga,
                                    signals, cancels); read sagas, their       read the history, the
                                    timers and indexes, the ends stream, the   dead letters or the
                                    refusals of start requests, the token      human tasks
                                    keys and the registered shapes
    <prefix>.tasks                  the task inbox of contexts with human      read or write a saga, its
      (task client)                 tasks: read and write (task_write) the     history or any stream;
                                    tasks, their indexes, timers and logs;     read the inbox; decide
                                    add the answers' signals to the inboxes;   who may act (the app's
                                    read the registered shapes                 authorizer does)
    <prefix>.relay                  add outbox rows to the inboxes (and to     read them
                                    --relay-stream streams); read rs:epoch
    <prefix>.operator               read every key of the app's contexts but   write anything, read the
                                    the context's secrets, and its rate        signal secret, a human
                                    limits' buckets and changes                task's resume token or a
                                                                               pending timer's signed
                                                                               firing, change a rate limit

Operator **writes** (cancel, retry, force-complete, dlq requeue|purge, versions drain|...,
limits set) run as the context's orchestrator user, signed with an operator's keyring. The built-in
``tasks`` participant (it opens and withdraws tasks, and fires their reminders and escalation
steps) runs inside the orchestrator's worker, as its user; the read-only operator reads the
task inbox with the rest of the partition.

Key patterns are anchored: a partition's tag is matched digit by digit
(``rs:{orders:[0-9]}:…``, ``rs:{orders:[1-9][0-9]}:…``), never with a ``*`` that could cross a
``}``; and ids and names are validated before they become part of a key (``saga/store/keys/``).
Write-only targets (``%W~``) are passed to functions as arguments, not keys, because Redis
checks every key of an ``FCALL`` as read-write. Commands: ``-@all``, then the plain commands
the role sends and every command its functions call, parsed from the scripts' source and the
shared helpers they call (Redis 7 checks each ``redis.call`` in a function against the
caller's ACL, keys included). Scripts run as Redis Functions (``FCALL``), never ``EVAL``: no
user may run Lua of its own, and none may load functions (an admin loads them: ``saga
functions load``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter, methodcaller
from typing import Any, Final

from bus import Stream
from saga.core.child_messages import CHILD
from saga.definition.human_tasks import TASKS
from saga.definition.saga import LOCAL, Context, Saga
from saga.definition.waits import WAITS
from saga.ops.acl_grants import AclUser, Grant, grant, unique
from saga.runtime.app import App
from saga.runtime.event_routing import event_waits
from saga.runtime.tasks import task_contexts
from saga.store import scripts
from saga.store.keys import (
    CONTEXTS,
    EPOCH,
    EPOCH_COPIES,
    LIMIT_NAMES,
    ContextKeys,
    LimitKeys,
    PartitionKeys,
    SlotKeys,
    slot_lines,
    slot_waiters,
)

_CONNECT: Final = ("auth", "hello", "client|setname", "ping", "info", "cluster|slots", "command")
"""Every process: connecting, ``INFO`` for the start-up check of Redis settings, and what a
Redis Cluster client reads when it connects (the slot map, ``CLUSTER SLOTS``, and the
command table, ``COMMAND``); both are refused harmlessly by a server that is no cluster."""
_SCRIPTS: Final = ("fcall",)
"""redsaga's Lua runs as functions an admin loaded (``bus/_scripts.py``)."""
_CONSUME: Final = (
    "xreadgroup", "xgroup|create", "xautoclaim", "xpending", "xinfo|consumers",
    "xread",  # an idempotent group's wake-up before it reads and claims (bus/_intake.py): it consumes nothing
    "exists", "xinfo|groups",  # the worker's metrics and /readyz: its groups' pending and lag
)  # fmt: skip
_READ: Final = (
    "time", "exists", "type", "get", "mget", "hget", "hgetall", "hmget", "hkeys", "hlen", "lrange", "llen",
    "smembers", "sismember", "zrange", "zrangebyscore", "zrevrangebyscore", "zscore", "zmscore", "zcount",
    "zcard",
    "xlen", "xrange", "xrevrange", "xpending", "xinfo|groups", "xinfo|consumers", "xinfo|stream",
)  # fmt: skip
"""What the read-only operator commands send (no ``MULTI``: a cluster has none; saga/store/branches.py)."""
_CLIENT_READS: Final = (
    "exists", "get", "hget", "hgetall", "hmget", "zmscore", "zrange", "zscore", "time", "xrevrange", "xread",
)  # fmt: skip
"""What ``SagaClient`` reads: a saga and its branches, its timers, the indexes, token keys, and
the ends stream it waits on (``wait``, ``result``)."""
_ORCHESTRATE: Final = ("sadd", "set", "hdel")
"""Plain writes of an orchestrator: the contexts set, the signal secret, ended waits."""
_OPERATE: Final = ("hsetnx", "srem", "del", "xdel")
"""Plain writes of operator actions (drain, decommission, dlq purge)."""
_TASK_READS: Final = ("time", "hget", "zrange", "lrange")
"""What ``TaskClient`` reads: a task and its token, an assignee's index, a saga's task log, Redis's clock."""
_CATALOGUE_READS: Final = ("smembers", "hgetall", "hkeys", "mget")
"""What ``TaskClient.from_redis`` reads: the contexts, their shapes and participants."""

_CONSUMER_SCRIPTS: Final = (
    ("bus", "epoch"), ("bus", "ack"), ("bus", "record"), ("bus", "complete_batch"), ("bus", "dedupe_claim"),
    ("bus", "read_claim"),  # an idempotent group's read (a participant's, the orchestrator's local actions)
    ("bus", "fail"), ("bus", "heartbeat"), ("bus", "delete_consumer"), ("bus", "trim"),
    ("bus", "publish"),  # the dead letter of an entry deleted while pending (GroupConsumer)
)  # fmt: skip
_PARTICIPANT_SCRIPTS: Final = tuple(s for s in _CONSUMER_SCRIPTS if s != ("bus", "epoch"))
"""A participant reads ``rs:epoch`` (``GET``) and never runs the function that writes it."""
_PUBLISH_SCRIPTS: Final = (("bus", "publish"), ("bus", "publish_batch"))
_LIMIT_SCRIPTS: Final = ((scripts.PACKAGE, scripts.RATE_TAKE.name), (scripts.PACKAGE, scripts.RATE_SET.name))
"""Run on a rate limit's keys only (``_limit_grants``), never on a partition's."""
_SLOT_SCRIPTS: Final = ((scripts.PACKAGE, scripts.SLOT.name),)
"""Run on a concurrency key's lines only (``_slot_grants``), never on a partition's."""
_SAGA_SCRIPTS: Final = (
    *(
        (scripts.PACKAGE, s.name)
        for s in scripts.SCRIPTS
        if (scripts.PACKAGE, s.name) not in (*_LIMIT_SCRIPTS, *_SLOT_SCRIPTS)
    ),
    ("bus", "requeue"),
)
_RELAY_SCRIPTS: Final = (("relay", "publish_rows"),)


def acl_rules(
    app: App, *, prefix: str = "redsaga", relay_streams: Iterable[str] = (), upgrading_dedupe: bool = False
) -> list[AclUser]:
    """The ACL users of ``app``: orchestrators, participants, a client, the relay, an operator.

    ``relay_streams`` are further stream keys the app's relay publishes to (domain events
    written through the outbox); their ``published`` windows are included.
    ``upgrading_dedupe``: consumers may also write the dedupe keys of earlier releases (one
    key per record, ``Stream.legacy_dedupe_key``), which workers of those releases write;
    without it they only read them (a fallback while they live) and cannot make more keys.
    """
    legacy = "" if upgrading_dedupe else "%R"
    definitions = list(app.registry)
    contexts = app.registry.contexts
    limits = _limit_grants(app)  # every orchestrator takes tokens of every limit its app declares
    users = [
        _orchestrator(prefix, context, definitions, contexts, limits, legacy=legacy)
        for context in contexts.values()
    ]
    users += [
        _participant(prefix, context, participant.name, legacy)
        for participant in app.participants
        for context in participant.serves
    ]
    if contexts:
        users.append(_client(prefix, contexts.values()))
    with_tasks = [contexts[name] for name in sorted(task_contexts(app.registry))]
    if with_tasks:
        users.append(_task_client(prefix, with_tasks, contexts.values()))
    relayed = [c for p in app.participants if p.uses_outbox for c in p.serves]
    users.append(_relay(prefix, unique(relayed), [Stream.from_key(k) for k in relay_streams]))
    streams = [s.stream for bus in app.buses for s in bus.subscriptions]
    users.append(_operator(prefix, contexts.values(), streams, app))
    return users


def _limit_grants(app: App) -> tuple[Grant, ...]:
    """An orchestrator's rate limits: take and give back tokens, record their names.

    The same user runs ``saga limits set`` (an operator write, as the others are); no other
    principal may change a limit.
    """
    if not app.limits:
        return ()
    keys = ["~" + LimitKeys(limit.name).everything for limit in app.limits]
    return (grant(_SCRIPTS, _LIMIT_SCRIPTS, keys), Grant(("sadd",), ("~" + LIMIT_NAMES,)))


def _slot_grants(context: str, ours: list[Saga[Any]]) -> tuple[Grant, ...]:
    """An orchestrator's concurrency keys: take and give back its context's slots, index its lines."""
    if not any(d.concurrency is not None for d in ours):
        return ()
    lines = ["~" + SlotKeys(context, "*", "*").everything]
    index = ("~" + slot_lines(context), "~" + slot_waiters(context))
    return (grant(_SCRIPTS, _SLOT_SCRIPTS, lines), Grant(("zadd", "zrevrangebyscore", "hset", "hdel"), index))


def _orchestrator(
    prefix: str,
    context: Context,
    definitions: list[Saga[Any]],
    contexts: Mapping[str, Context],
    limits: tuple[Grant, ...],
    *,
    legacy: str,
) -> AclUser:
    name = context.name
    ours = [d for d in definitions if d.context.name == name]
    own = ContextKeys(name)
    keys = [
        *_partition_keys(context, _EVERYTHING), *_partition_keys(context, _TASK_TOKENS),
        *_partition_keys(context, _TIMER_DATA),
        "~" + own.wait_indexes, "~" + own.schedules.everything, "~" + own.meta, "~" + own.versions,
        "~" + CONTEXTS, "~" + EPOCH, "~" + EPOCH_COPIES,
    ]  # fmt: skip
    added: list[str] = []  # keys it may only add to, elsewhere
    windows: list[str] = []  # the publish windows of those streams
    read: list[str] = []  # keys of another context it may only read
    for stream in event_waits(ours):
        keys += _consumer_keys(stream, f"{name}.waits", legacy)
        added.append("%W~" + stream.dlq_key)
    children = [s.child.definition.context for d in ours for s in [*d.steps, *d.branch_steps()] if s.child]
    for declared in unique(c for c in children if c.name != name):
        # start and cancel by request, read the child's saga (a cancel finds its partition)
        child = contexts.get(declared.name, declared)
        added += _partition_keys(child, _INBOX, "%W")
        windows += _partition_keys(child, _WINDOW)
        read += _partition_keys(child, _SAGAS, "%R") + _partition_keys(child, _BRANCHES, "%R")
    parents = [d.context for d in definitions if d.context.name != name and _has_child_in(d, name)]
    for parent in unique(parents):  # the child's end report goes to the parent's inbox
        added += _partition_keys(parent, _INBOX, "%W")
        windows += _partition_keys(parent, _WINDOW)
    scripts = (*_CONSUMER_SCRIPTS, *_PUBLISH_SCRIPTS, *_SAGA_SCRIPTS)
    plain = (*_CONNECT, *_SCRIPTS, *_CONSUME, *_READ, *_ORCHESTRATE, *_OPERATE)
    grants = [grant(plain, scripts, keys)]
    grants += _elsewhere(added, windows, read)
    grants += limits
    grants += _slot_grants(name, ours)
    note = (
        f"orchestrator of context {name!r} ({context.partitions} partition(s)); also the user for "
        "operator writes: force-complete, cancel, retry, dlq requeue|purge, versions drain|migrate, "
        "limits set"
    )
    return AclUser(f"{prefix}.{name}", "orchestrator", name, tuple(grants), note)


def _participant(prefix: str, context: Context, participant: str, legacy: str) -> AclUser:
    if participant in (LOCAL, WAITS, CHILD, TASKS):
        raise ValueError(f"participant name {participant!r} is reserved for the orchestrator")

    def stream(keys: PartitionKeys) -> Stream:
        return keys.commands(participant)

    own = [
        *_partition_keys(context, lambda k: stream(k).key),
        *_partition_keys(context, lambda k: stream(k).dedupe_key(participant)),
        *_partition_keys(context, lambda k: stream(k).dedupe_expiry_key(participant)),
        *_partition_keys(context, lambda k: stream(k).legacy_dedupe_key(participant, "*"), legacy),
        *_partition_keys(context, lambda k: stream(k).failures_key(participant)),
        *_partition_keys(context, lambda k: stream(k).lost_key(participant)),
    ]
    registry = ContextKeys(context.name)
    added = [
        *_partition_keys(context, _INBOX, "%W"),  # its replies: it reads nobody's
        *_partition_keys(context, _DEAD_LETTERS, "%W"),  # its dead letters: it cannot read or delete them
    ]
    read = [
        "%R~" + EPOCH,  # it joins and checks the deployment's epoch, never writes it
        "%R~" + registry.shapes,  # its partition count, read at start
    ]
    grants = (
        Grant((*_CONNECT, "xadd"), tuple(added)),  # adding only: no trim, delete or ack there
        # it records that it runs, at start: its own record, and its name in the set (no other's)
        Grant(("set",), ("%W~" + registry.participant(participant),)),
        Grant(("sadd",), ("%W~" + registry.participants,)),
        grant((*_SCRIPTS, *_CONSUME), _PARTICIPANT_SCRIPTS, own),
        Grant(("get", "hgetall"), tuple(read)),
    )
    note = f"participant {participant!r} serving context {context.name!r}"
    return AclUser(f"{prefix}.{context.name}.{participant}", "participant", context.name, grants, note)


def _client(prefix: str, contexts: Iterable[Context]) -> AclUser:
    added: list[str] = []
    windows: list[str] = []
    read: list[str] = []
    for context in contexts:
        added += _partition_keys(context, _INBOX, "%W")  # start requests, signals, cancels
        windows += _partition_keys(context, _WINDOW)
        for readable in (_SAGAS, _BRANCHES, _TIMERS, _STATUS_INDEXES, _COUNTS, _REFUSALS, _ENDS):
            read += _partition_keys(context, readable, "%R")
        own = ContextKeys(context.name)
        read += [
            "%R~" + own.token_keys,  # checks tokens: public keys only
            "%R~" + own.shapes,  # checks signal data without the code
        ]
    note = "client: starts sagas by request, signals and cancels them, reads their state (SagaClient)"
    grants = (Grant(_CONNECT), *_elsewhere(added, windows, read))
    return AclUser(f"{prefix}.client", "client", None, grants, note)


def _task_client(prefix: str, with_tasks: Iterable[Context], contexts: Iterable[Context]) -> AclUser:
    inbox: list[str] = []
    own: list[str] = []
    for context in with_tasks:
        inbox += _partition_keys(context, _INBOX, "%W")  # the answers' signals: it reads none
        for key in (_TASK, _TASK_INDEXES, _TASK_TIMERS, _TASK_LOGS, _TASK_TOKENS):
            own += _partition_keys(context, key)
    registered = ["%R~" + CONTEXTS]
    for context in contexts:
        registered += [
            "%R~" + ContextKeys(context.name).shapes,
            "%R~" + ContextKeys(context.name).participants,
            "%R~" + ContextKeys(context.name).participant("*"),
        ]
    grants = (
        Grant(_CONNECT),
        grant((*_SCRIPTS, *_TASK_READS), [(scripts.PACKAGE, scripts.TASK_WRITE.name)], own),
        Grant(("xadd",), unique(inbox)),
        Grant(_CATALOGUE_READS, unique(registered)),
    )
    note = "task client: lists, claims, completes and reassigns human tasks (TaskClient, saga tasks)"
    return AclUser(f"{prefix}.tasks", "tasks", None, grants, note)


def _relay(prefix: str, contexts: Iterable[Context], streams: Iterable[Stream]) -> AclUser:
    added = [k for c in contexts for k in _partition_keys(c, _INBOX, "%W")]
    windows = [k for c in contexts for k in _partition_keys(c, _WINDOW)]
    for stream in streams:
        added.append("%W~" + stream.key)
        windows.append("~" + stream.published_key)
    note = "outbox relay: publishes outbox rows (participant replies, events) as their writers signed them"
    root = Grant(_CONNECT)
    epoch = Grant(("get",), ("%R~" + EPOCH,))  # its readiness checks the deployment's epoch
    rows = grant(_SCRIPTS, _RELAY_SCRIPTS, windows)
    grants = (root, epoch, Grant(("xadd",), unique(added)), rows) if added else (root, epoch)
    return AclUser(f"{prefix}.relay", "relay", None, grants, note)


def _operator(prefix: str, contexts: Iterable[Context], streams: Iterable[Stream], app: App) -> AclUser:
    keys: list[str] = ["%R~" + CONTEXTS, "%R~" + EPOCH]
    if app.limits:  # saga limits list: the buckets and their changes, never a change
        keys += ["%R~" + LIMIT_NAMES, *("%R~" + LimitKeys(limit.name).everything for limit in app.limits)]
    keyed = {d.context.name for d in app.registry if d.concurrency is not None}
    for context in contexts:
        own = ContextKeys(context.name)
        keys += _partition_keys(context, _EVERYTHING, "%R")
        if context.name in keyed:  # saga limits list, inspect: the lines of concurrency keys
            keys += ["%R~" + SlotKeys(context.name, "*", "*").everything]
            keys += ["%R~" + slot_lines(context.name), "%R~" + slot_waiters(context.name)]
        keys += [
            "%R~" + own.wait_indexes,
            "%R~" + own.schedules.everything,
            "%R~" + own.versions,
            "%R~" + own.token_keys,  # not the meta key holding a secret
        ]
    keys += ["%R~" + PartitionKeys(s.tag).everything for s in streams]
    note = "read-only operator: inspect, list, stats, export, dlq list|show, versions list, ui (no secrets)"
    grants = (grant(_CONNECT + _READ, (), keys),)
    return AclUser(f"{prefix}.operator", "operator", None, grants, note)


def _elsewhere(added: list[str], windows: list[str], read: list[str]) -> list[Grant]:
    """Selectors for keys not its own.

    Streams it only adds to (with the publish function, and their windows), keys it only reads.
    """
    grants = []
    if added:
        grants.append(Grant(("xadd",), unique(added)))
        grants.append(grant(_SCRIPTS, _PUBLISH_SCRIPTS, windows))
    if read:
        grants.append(Grant(_CLIENT_READS, unique(read)))
    return grants


def _has_child_in(definition: Saga[Any], context: str) -> bool:
    steps = [*definition.steps, *definition.branch_steps()]
    return any(s.child is not None and s.child.definition.context.name == context for s in steps)


def partition_tags(context: Context) -> list[str]:
    """Glob tags matching exactly the partition tags of ``context``, by number of digits.

    ``[0-9]``, then ``[1-9][0-9]``, … up to the digits of its last partition: a ``*`` could
    match a ``}`` and so a key another principal's pattern was never meant to reach.
    """
    digits = len(str(context.partitions - 1))
    return [
        f"{context.name}:" + ("[0-9]" if n == 1 else "[1-9]" + "[0-9]" * (n - 1))
        for n in range(1, digits + 1)
    ]


Pattern = Callable[[PartitionKeys], str]
"""A key of a partition, asked of :mod:`saga.store.keys` with a glob for its tag."""

_EVERYTHING: Final[Pattern] = attrgetter("everything")
_INBOX: Final[Pattern] = attrgetter("inbox.key")
_WINDOW: Final[Pattern] = attrgetter("inbox.published_key")
_DEAD_LETTERS: Final[Pattern] = attrgetter("dead_letters")
_SAGAS: Final[Pattern] = methodcaller("saga", "*")
_BRANCHES: Final[Pattern] = methodcaller("branches", "*")
_REFUSALS: Final[Pattern] = methodcaller("refused_start", "*")
_TIMERS: Final[Pattern] = attrgetter("timers")
_STATUS_INDEXES: Final[Pattern] = methodcaller("by_status", "*")
_COUNTS: Final[Pattern] = attrgetter("counts")
_ENDS: Final[Pattern] = attrgetter("ends")
_TASK: Final[Pattern] = methodcaller("task", "*")
_TASK_INDEXES: Final[Pattern] = methodcaller("tasks_for", "*")
_TASK_TIMERS: Final[Pattern] = attrgetter("task_timers")
_TASK_LOGS: Final[Pattern] = methodcaller("task_log", "*")
_TASK_TOKENS: Final[Pattern] = attrgetter("task_tokens")
"""Open tasks' resume tokens: outside ``_EVERYTHING``, so the operator's patterns miss them."""
_TIMER_DATA: Final[Pattern] = attrgetter("timer_data")
"""Pending timers' signed firings: outside ``_EVERYTHING`` too, for the orchestrator alone."""


def _partition_keys(context: Context, key: Pattern, access: str = "") -> list[str]:
    """``access`` (``""`` read-write, ``%R``, ``%W``) to ``key`` in every partition of ``context``."""
    return [f"{access}~" + key(PartitionKeys(tag)) for tag in partition_tags(context)]


def _consumer_keys(stream: Stream, group: str, legacy: str) -> list[str]:
    """What consuming ``stream`` as ``group`` touches: the stream and its companion keys.

    ``legacy``: the access to earlier releases' dedupe keys (``%R``, or ``""`` while upgrading).
    """
    return [
        "~" + stream.key,
        "%W~" + stream.dlq_key,
        "~" + stream.failures_key(group),
        "~" + stream.dedupe_key(group),
        "~" + stream.dedupe_expiry_key(group),
        f"{legacy}~" + stream.legacy_dedupe_key(group, "*"),
        "~" + stream.lost_key(group),
    ]
