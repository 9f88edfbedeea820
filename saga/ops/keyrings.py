"""Master keys and the keyrings an app's processes need (what ``saga keys`` runs).

The **master file** holds one secret per key id; it never leaves the place keys are made (a
vault, an operator's machine). Each process gets a **keyring** issued from it for the
principals it runs, with only what those send and read (``bus/_auth.py``):

- ``orchestrator:<context>``: its own receiving root (timers, local actions, its inbox), a
  sending key to each participant serving the context and to the orchestrators of the
  contexts its sagas start children in or report to, and the roots of the streams its
  event waits read;
- ``participant:<name>``: its root, and a sending key to the orchestrator of each context it
  serves (its replies);
- ``client:<name>`` and ``operator:<name>``: a sending key to every orchestrator of the app
  (start, signal, cancel; an operator's retry, force-complete, redrive);
- ``service:<name>``: the roots of the streams its subscriptions read (a ``Bus`` of the app),
  and sending keys for the streams it publishes domain events to (``publishes``: through the
  outbox, whose rows it signs as it writes them, or a ``Bus``). The relay needs no keyring:
  it publishes rows as their writers signed them.

Rotation: :func:`rotate` adds a key id (the newest signs), :func:`retire` removes one; issue
the keyrings again after each and roll them out (docs/security.md has the runbook).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from bus import AuthError, Keyring, principal
from bus.lowlevel import check_key_id, issue, stream_audience
from saga.definition.human_tasks import TASKS
from saga.runtime.app import App
from saga.runtime.event_routing import event_waits
from saga.runtime.tasks import task_contexts
from saga.store.trust import orchestrator_of, participant_named


class MasterKey(msgspec.Struct, kw_only=True):
    """One key id of the master file."""

    kid: str
    secret: str
    created: str


class MasterFile(msgspec.Struct, kw_only=True):
    """The master file (``saga keys generate``): every key id's secret, oldest first."""

    redsaga_master: int = 1
    keys: list[MasterKey] = msgspec.field(default_factory=list)

    def secrets(self) -> dict[str, bytes]:
        """Key id -> secret, oldest first."""
        return {k.kid: base64.urlsafe_b64decode(k.secret + "=" * (-len(k.secret) % 4)) for k in self.keys}


@dataclass(frozen=True, slots=True)
class Reach:
    """What one principal sends to and reads."""

    sends_to: set[str] = field(default_factory=set)
    streams: set[str] = field(default_factory=set)


def new_master(*, kid: str | None = None, now: datetime | None = None) -> MasterFile:
    """A master file with one fresh key id."""
    return rotate(MasterFile(), kid=kid, now=now)


def rotate(master: MasterFile, *, kid: str | None = None, now: datetime | None = None) -> MasterFile:
    """``master`` with a new key id (32 random bytes); new keyrings sign with it."""
    moment = now or datetime.now(UTC)
    taken = {k.kid for k in master.keys}
    chosen = check_key_id(kid) if kid else _next_kid(moment, taken)
    if chosen in taken:
        raise AuthError(f"key id {chosen!r} exists already")
    secret = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
    added = MasterKey(kid=chosen, secret=secret, created=moment.isoformat(timespec="seconds"))
    return MasterFile(keys=[*master.keys, added])


def retire(master: MasterFile, kid: str) -> MasterFile:
    """``master`` without key id ``kid``: entries and tokens signed with it stop verifying."""
    kept = [k for k in master.keys if k.kid != kid]
    if len(kept) == len(master.keys):
        raise AuthError(f"no key id {kid!r} (the master file has {', '.join(k.kid for k in master.keys)})")
    if not kept:
        raise AuthError(f"{kid!r} is the only key id: rotate first, then retire it")
    return MasterFile(keys=kept)


def _next_kid(moment: datetime, taken: set[str]) -> str:
    base = moment.strftime("%Y-%m-%d")
    if base not in taken:
        return base
    n = 2
    while f"{base}.{n}" in taken:
        n += 1
    return f"{base}.{n}"


def encode_master(master: MasterFile) -> bytes:
    """The master file's bytes (it holds secrets: :func:`write_secret_file` writes it)."""
    return msgspec.json.format(msgspec.json.encode(master), indent=2) + b"\n"


def read_master(path: Path) -> MasterFile:
    """Read a master file (:class:`bus.AuthError` saying why it cannot be used)."""
    try:
        master = msgspec.json.decode(path.read_bytes(), type=MasterFile)
    except OSError as error:
        raise AuthError(f"cannot read the master file {path}: {error.strerror}") from error
    except msgspec.DecodeError as error:
        raise AuthError(f"{path} is not a redsaga master file: {error}") from error
    if master.redsaga_master != 1 or not master.keys:
        raise AuthError(f"{path} is not a usable redsaga master file (format 1, at least one key id)")
    return master


def write_secret_file(path: Path, content: bytes, *, replace: bool) -> None:
    """Write ``content`` to ``path`` readable by its owner only (refuse to overwrite unless ``replace``)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL)
    try:
        descriptor = os.open(path, flags, 0o600)
    except FileExistsError as error:
        raise AuthError(f"{path} exists already; keys are never overwritten by accident") from error
    except OSError as error:
        raise AuthError(f"cannot write {path}: {error.strerror}") from error
    with os.fdopen(descriptor, "wb") as out:
        out.write(content)


def reach_of(
    app: App,
    *,
    clients: Iterable[str] = (),
    operators: Iterable[str] = (),
    publishes: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, Reach]:
    """Every principal of ``app`` (and the named clients and operators) with what it reaches.

    ``publishes`` maps a service name (a bus of the app, or a service that only writes outbox
    rows) to the stream keys it publishes domain events to: ``service:<name>`` gets the key
    for sending to each.
    A context with human tasks has the ``participant:tasks`` principal too: the task inbox
    its orchestrator's worker runs, so that worker holds both keyrings.
    """
    orchestrators = {name: orchestrator_of(name) for name in app.registry.contexts}
    reach: dict[str, Reach] = {}
    for name, me in orchestrators.items():
        own = [d for d in app.registry if d.context.name == name]
        found = reach.setdefault(me, Reach())
        found.sends_to.update(
            participant_named(p.name) for p in app.participants if any(c.name == name for c in p.serves)
        )
        found.streams.update(stream.key for stream in event_waits(own))
        for definition in own:
            for step in [*definition.steps, *definition.branch_steps()]:
                if step.child is not None and step.child.definition.context.name != name:
                    child = orchestrator_of(step.child.definition.context.name)
                    found.sends_to.add(child)  # it starts and cancels the child there
                    reach.setdefault(child, Reach()).sends_to.add(me)  # the child reports its end here
    for name in sorted(task_contexts(app.registry)):  # the worker's built-in task inbox
        reach[orchestrators[name]].sends_to.add(participant_named(TASKS))
        reach.setdefault(participant_named(TASKS), Reach()).sends_to.add(orchestrators[name])
    for participant in app.participants:
        reach.setdefault(participant_named(participant.name), Reach()).sends_to.update(
            orchestrator_of(c.name) for c in participant.serves
        )
    for role, names in (("client", clients), ("operator", operators)):
        for name in names:
            reach.setdefault(principal(role, name), Reach()).sends_to.update(orchestrators.values())
    for bus in app.buses:
        found = reach.setdefault(bus.principal, Reach())
        found.streams.update(s.stream.key for s in bus.subscriptions if s.audience.startswith("stream:"))
    for name, keys in (publishes or {}).items():
        found = reach.setdefault(principal("service", name), Reach())
        found.sends_to.update(stream_audience(key) for key in keys)
    return reach


def keyrings_by_process(app: App, reach: Mapping[str, Reach]) -> dict[str, list[str]]:
    """The principals each process of ``app`` holds, by the principal it is named after.

    One process per principal, but the task inbox (``participant:tasks``) runs in the worker
    of each context with human tasks: that orchestrator's process holds both.
    """
    tasks = participant_named(TASKS)
    hosts = {orchestrator_of(name) for name in task_contexts(app.registry)}
    return {who: [who, tasks] if who in hosts else [who] for who in sorted(reach) if who != tasks}


def issue_keyrings(
    master: MasterFile, reach: Mapping[str, Reach], principals: Iterable[str]
) -> list[Keyring]:
    """The keyrings of ``principals`` (each must be one of ``reach``)."""
    secrets = master.secrets()
    keyrings = []
    for who in principals:
        if who not in reach:
            raise AuthError(
                f"{who} is not a principal of this app (it has {', '.join(sorted(reach))}); "
                "name clients and operators with --client and --operator"
            )
        found = reach[who]
        keyrings.append(issue(secrets, who, sends_to=found.sends_to, streams=found.streams))
    return keyrings


def describe(master: MasterFile) -> list[dict[str, Any]]:
    """The master file's key ids, for ``saga keys list`` (never a secret)."""
    newest = master.keys[-1].kid if master.keys else ""
    return [{"kid": k.kid, "created": k.created, "signs": k.kid == newest} for k in master.keys]
