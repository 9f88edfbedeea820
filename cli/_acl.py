"""``saga acl``: the Redis ACL users an App's processes need (see docs/security.md)."""

from __future__ import annotations

import os
import re
from typing import Annotated

import typer

from redsaga.cli._common import CommandError, Json, UsageProblem, app_option, emit_json, emit_line
from redsaga.cli._load import load_app
from saga.ops.acl import acl_rules
from saga.ops.acl_grants import as_json

LOCK_DEFAULT = "ACL SETUSER default off"
"""What locks Redis's built-in user: it can do anything, by default without a password."""


def acl(
    app_ref: Annotated[str, app_option("The App whose users to print, as module:attribute.")],
    password_env: Annotated[
        str | None,
        typer.Option(
            "--password-env",
            help="Read each user's password from the environment variable <VAR>_<USER> (user name "
            "upper-cased, other characters as _), e.g. REDSAGA_ACL_REDSAGA_ORDERS_PAYMENTS; the "
            "lines hold only its SHA-256.",
            metavar="VAR",
        ),
    ] = None,
    nopass: Annotated[
        bool, typer.Option("--nopass", help="Users without a password (local use only).")
    ] = False,
    prefix: Annotated[str, typer.Option(help="Prefix of the user names.")] = "redsaga",
    relay_stream: Annotated[
        list[str] | None,
        typer.Option("--relay-stream", help="Another stream key the relay publishes to (repeatable)."),
    ] = None,
    lock_default: Annotated[
        bool,
        typer.Option(
            "--lock-default",
            help="End with ACL SETUSER default off: nobody logs in without a user of their own. "
            "Apply it once an admin user of yours exists (you stay logged in as you are).",
        ),
    ] = False,
    upgrading_dedupe: Annotated[
        bool,
        typer.Option(
            "--upgrading-dedupe",
            help="Let consumers also write the dedupe keys of earlier releases (one key per "
            "record): apply these lines while such workers still run, then the lines without it "
            "(which only read those keys) once every worker is upgraded.",
        ),
    ] = False,
    json_output: Json = False,
) -> None:
    """Print an ``ACL SETUSER`` line per Redis user the App's processes need.

    One user per orchestrator context, one per participant and context it serves, a client
    (starts by request, signals, cancels), the outbox relay and a read-only operator (inspect,
    list, stats, export, dlq list; no secrets); operator writes (force-complete, cancel,
    retry, dlq requeue) need the orchestrator's user. The users assume signing is on
    (REDSAGA_KEYRING). The lines go to stdout (pipe them into ``redis-cli``), what each user
    is for to stderr, and how to lock the default user. --json: a list of {name, role,
    context, note, rules}, rules being the ACL SETUSER arguments after the name.
    """
    if nopass == (password_env is not None):
        raise UsageProblem("give exactly one of --password-env VAR and --nopass")
    app = load_app(app_ref)
    users = acl_rules(app, prefix=prefix, relay_streams=relay_stream or (), upgrading_dedupe=upgrading_dedupe)
    passwords: dict[str, str | None] = {u.name: None for u in users}
    if password_env is not None:
        variables = {u.name: f"{password_env}_{re.sub(r'[^A-Za-z0-9]', '_', u.name).upper()}" for u in users}
        missing = [v for v in variables.values() if not os.environ.get(v)]
        if missing:
            raise CommandError(f"set a password in each of: {', '.join(missing)}")
        passwords = {name: os.environ[v] for name, v in variables.items()}
    if json_output:
        emit_json(as_json(users, passwords))
        return
    for user in users:
        emit_line(f"# {user.name}: {user.note}", err=True)  # stdout stays pipeable into redis-cli
        emit_line(user.line(passwords[user.name]))
    if lock_default:
        emit_line(LOCK_DEFAULT)
    else:
        emit_line(
            "# then lock the default user (it may do anything, without a password by default): "
            "create an admin user of your own, then ACL SETUSER default off (or pass --lock-default)",
            err=True,
        )
