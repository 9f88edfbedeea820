"""Redis ACL users for an app: each process gets only its own keys and the commands it sends.

:func:`acl_rules` derives the users from the app's definitions and the key layout
(``saga/_keys.py``, ``bus/_keys.py``), never from a hand-kept list of keys:

- ``<prefix>.<context>``: the orchestrator of one context. Every key of the context's
  partitions (``rs:{orders:<n>}:*``: sagas, history, inbox, the command streams it writes for
  its participants, timers, indexes, dead letters), its event-wait index
  (``rs:{orders:w:…}``), schedules (``rs:{orders:sched}``), signal secret
  (``rs:{orders:meta}``), version registry (``rs:{orders}:versions:*``) and
  ``rs:{redsaga}:contexts``; the streams its sagas wait on; for child sagas the child
  context's partitions, and for parents in other contexts their inboxes (the child reports
  its end there). Operator writes (force-complete, cancel, retry, requeue, drain) run as this
  user too.
- ``<prefix>.<context>.<participant>``: one participant in one context it serves. Its
  command stream ``rs:{orders:<n>}:cmd:<participant>``, its dedupe and failure records, and
  what its scripts write in the same slot: the reply on the partition's inbox, the
  dead-letter stream, and the publish-dedupe window ``…:published`` of the dead letters it
  publishes (an entry deleted while pending); and the record that it runs
  (``rs:{orders}:versions:participants``, which operators' tools read).
- ``<prefix>.relay``: the outbox relay. ``FCALL`` of the publish function on the inboxes of
  the contexts whose participants reply through the outbox (and on ``relay_streams``).
- ``<prefix>.operator``: read-only, for ``saga inspect``, ``list``, ``stats``, ``export``,
  ``dlq list|show`` and ``versions list``.

Commands: ``-@all``, then the plain commands the role sends and every command its Lua
scripts call, parsed from the scripts' source and the shared helpers they call (Redis 7
checks each ``redis.call`` in a function against the caller's ACL, keys included). Scripts
run as Redis Functions (``FCALL``), never ``EVAL``: no user may run Lua of its own, and none
may load functions (an admin loads them: ``saga functions load``). ACL globs treat ``{`` and ``}`` as plain
characters and let ``*`` span ``:``; a context name has no ``:``, so
``rs:{orders:[0-9]*}`` matches the partitions of ``orders`` and nothing of another context.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Final, Literal

from bus import EPOCH_KEY, Stream, tagged_key
from bus._keys import PREFIX
from bus._scripts import shared_helpers
from saga._app import App
from saga._definition import LOCAL, Context, Saga
from saga._event_waits import event_waits
from saga._keys import CHILD, CONTEXTS, WAITS

Role = Literal["orchestrator", "participant", "relay", "operator"]

_CONNECT: Final = ("auth", "hello", "client|setname", "ping", "info")
"""Every process: connecting, and ``INFO`` for the start-up check of Redis settings."""
_SCRIPTS: Final = ("fcall",)
"""redsaga's Lua runs as functions an admin loaded (``bus/_scripts.py``)."""
_CONSUME: Final = ("xreadgroup", "xgroup|create", "xautoclaim", "xpending", "xinfo|consumers")
_READ: Final = (
    "time", "exists", "type", "get", "hget", "hgetall", "hmget", "hkeys", "hlen", "lrange", "llen",
    "smembers", "sismember", "zrange", "zrangebyscore", "zscore", "zmscore", "zcount", "zcard",
    "xlen", "xrange", "xrevrange", "xpending", "xinfo|groups", "xinfo|consumers", "xinfo|stream",
    "multi", "exec", "discard",
)  # fmt: skip
"""What the read-only operator commands send (``multi``/``exec`` wrap consistent reads)."""
_ORCHESTRATE: Final = ("sadd", "set", "hdel")
"""Plain writes of an orchestrator: the contexts set, the signal secret, ended waits."""
_OPERATE: Final = ("hsetnx", "srem", "del", "xdel")
"""Plain writes of operator actions (drain, decommission, dlq purge)."""

_CONSUMER_SCRIPTS: Final = (
    ("bus", "epoch"), ("bus", "ack"), ("bus", "record"), ("bus", "complete_batch"), ("bus", "dedupe_claim"),
    ("bus", "fail"), ("bus", "heartbeat"), ("bus", "delete_consumer"), ("bus", "trim"),
    ("bus", "publish"),  # the dead letter of an entry deleted while pending (GroupConsumer)
)  # fmt: skip
_PUBLISH_SCRIPTS: Final = (("bus", "publish"), ("bus", "publish_batch"))
_SAGA_SCRIPTS: Final = (
    ("saga", "transition"), ("saga", "fire_timers"), ("saga", "prune_ended"),
    ("saga", "register_shape"), ("saga", "workers"), ("saga", "schedule_write"),
    ("saga", "watch_event"), ("saga", "route_event"), ("saga", "migrate"), ("bus", "requeue"),
)  # fmt: skip
_RELAY_SCRIPTS: Final = (("relay", "publish_rows"),)

_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z]+)')?")
_CONTAINERS: Final = frozenset({"xinfo", "xgroup", "client", "script", "object", "config"})


@dataclass(frozen=True, slots=True)
class AclUser:
    """One Redis ACL user: its name, what it is for, its commands and its key patterns.

    ``commands`` are ACL command names (``xgroup|create`` for a subcommand); ``keys`` are
    ACL key selectors (``~pattern`` read-write, ``%R~pattern`` read-only).
    """

    name: str
    role: Role
    context: str | None
    commands: tuple[str, ...]
    keys: tuple[str, ...]
    note: str

    def rules(self, password: str | None) -> list[str]:
        """The ``ACL SETUSER`` arguments after the user name.

        ``password`` is stored as its SHA-256 (``#<hex>``), so the rules never hold the
        secret itself; ``None`` makes a user without a password (``nopass``), for local use.
        """
        secret = "nopass" if password is None else "#" + hashlib.sha256(password.encode()).hexdigest()
        return [
            "reset", "on", secret, "-@all", *(f"+{c}" for c in self.commands),
            "resetkeys", *self.keys, "resetchannels",
        ]  # fmt: skip

    def line(self, password: str | None) -> str:
        """The ``ACL SETUSER`` line (for ``redis-cli`` or an ACL file after ``user``)."""
        return " ".join(["ACL", "SETUSER", self.name, *self.rules(password)])


def acl_rules(app: App, *, prefix: str = "redsaga", relay_streams: Iterable[str] = ()) -> list[AclUser]:
    """The ACL users of ``app``: orchestrators, participants, the relay, a read-only operator.

    ``relay_streams`` are further stream keys the app's relay publishes to (domain events
    written through the outbox); their ``published`` windows are included.
    """
    definitions = list(app.registry)
    contexts = app.registry.contexts
    users = [_orchestrator(prefix, context, definitions) for context in contexts.values()]
    users += [
        _participant(prefix, context, participant.name)
        for participant in app.participants
        for context in participant.serves
    ]
    relayed = [c for p in app.participants if p.uses_outbox for c in p.serves]
    users.append(_relay(prefix, _unique(relayed), [Stream.from_key(k) for k in relay_streams]))
    users.append(_operator(prefix))
    return users


def _orchestrator(prefix: str, context: Context, definitions: list[Saga[Any]]) -> AclUser:
    name = context.name
    own = [d for d in definitions if d.context.name == name]
    keys = [
        _partitions(name, "*"), _key(f"{name}:w:*", "*"), _key(f"{name}:sched", "*"),
        _key(f"{name}:meta", "*"), _key(name, "versions:*"), "~" + CONTEXTS, "~" + EPOCH_KEY,
    ]  # fmt: skip
    for stream in event_waits(own):
        keys += _consumer_keys(stream, f"{name}.waits")
    children = [s.child.definition for d in own for s in [*d.steps, *d.branch_steps()] if s.child]
    for child in _unique(c.context for c in children):
        if child.name != name:
            keys += [_partitions(child.name, "*"), _key(f"{child.name}:meta", "*")]
    for parent in _unique(
        d.context for d in definitions if d.context.name != name and _has_child_in(d, name)
    ):
        keys += [_partitions(parent.name, "inbox"), _partitions(parent.name, "published")]
    scripts = (*_CONSUMER_SCRIPTS, *_PUBLISH_SCRIPTS, *_SAGA_SCRIPTS)
    plain = (*_CONNECT, *_SCRIPTS, *_CONSUME, *_READ, *_ORCHESTRATE, *_OPERATE)
    note = (
        f"orchestrator of context {name!r} ({context.partitions} partition(s)); also the user for "
        "operator writes: force-complete, cancel, retry, dlq requeue|purge, versions drain|migrate"
    )
    return AclUser(f"{prefix}.{name}", "orchestrator", name, _commands(plain, scripts), _unique(keys), note)


def _participant(prefix: str, context: Context, participant: str) -> AclUser:
    if participant in (LOCAL, WAITS, CHILD):
        raise ValueError(f"participant name {participant!r} is reserved for the orchestrator")
    stream = f"cmd:{participant}"
    keys = [
        _partitions(context.name, stream),
        _partitions(context.name, f"dedupe:{participant}:*"),
        _partitions(context.name, f"failures:{stream}:{participant}"),
        _partitions(context.name, "inbox"),
        _partitions(context.name, "published"),
        _partitions(context.name, "dlq"),
        "~" + EPOCH_KEY,  # every worker joins and checks the deployment's epoch
        "%R~" + tagged_key(context.name, "versions", "shapes"),  # its partition count, read at start
        "~" + tagged_key(context.name, "versions", "participants"),  # records that it runs, at start
    ]
    note = f"participant {participant!r} serving context {context.name!r}"
    return AclUser(
        f"{prefix}.{context.name}.{participant}",
        "participant",
        context.name,
        _commands((*_CONNECT, *_SCRIPTS, *_CONSUME, "hgetall", "hset"), _CONSUMER_SCRIPTS),
        tuple(keys),
        note,
    )


def _relay(prefix: str, contexts: Iterable[Context], streams: Iterable[Stream]) -> AclUser:
    keys = [k for c in contexts for k in (_partitions(c.name, "inbox"), _partitions(c.name, "published"))]
    keys += [k for s in streams for k in ("~" + s.key, "~" + s.published_key)]
    note = "outbox relay: publishes outbox rows (participant replies, events) with its publish script"
    return AclUser(
        f"{prefix}.relay",
        "relay",
        None,
        _commands((*_CONNECT, *_SCRIPTS), _RELAY_SCRIPTS),
        _unique(keys),
        note,
    )


def _operator(prefix: str) -> AclUser:
    note = "read-only operator: inspect, list, stats, export, dlq list|show, versions list"
    return AclUser(
        f"{prefix}.operator", "operator", None, _commands(_CONNECT + _READ, ()), (f"%R~{PREFIX}:*",), note
    )


def _has_child_in(definition: Saga[Any], context: str) -> bool:
    steps = [*definition.steps, *definition.branch_steps()]
    return any(s.child is not None and s.child.definition.context.name == context for s in steps)


def _key(tag: str, rest: str) -> str:
    return "~" + tagged_key(tag, rest)


def _partitions(context: str, rest: str) -> str:
    """Keys of every partition of ``context`` (hash tag ``<context>:<index>``)."""
    return _key(f"{context}:[0-9]*", rest)


def _consumer_keys(stream: Stream, group: str) -> list[str]:
    """What consuming ``stream`` as ``group`` touches: the stream and its companion keys."""
    return [
        "~" + stream.key,
        "~" + stream.dlq_key,
        "~" + stream.failures_key(group),
        "~" + stream.dedupe_key(group, "*"),
        "~" + stream.published_key,
    ]


def _commands(plain: Iterable[str], scripts: Iterable[tuple[str, str]]) -> tuple[str, ...]:
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


def _unique(items: Iterable[Any]) -> Any:
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
