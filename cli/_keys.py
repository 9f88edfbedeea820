"""``saga keys generate|rotate|retire|list|issue``: the keys that sign every entry.

The master file holds a secret per key id and stays where keys are made; ``issue`` writes
each process's keyring (``REDSAGA_KEYRING``) with only what its principals need. Secrets are
written to files readable by their owner only and never printed (``--out -`` is the one
explicit exception, for piping a keyring into a secret store).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from bus import AuthError, Stream, principal
from bus.lowlevel import encode_keyrings
from redsaga.cli._common import Json, emit_json, emit_table, reporting_errors
from redsaga.cli._load import load_object
from saga import App
from saga.ops.keyrings import (
    describe,
    encode_master,
    issue_keyrings,
    keyrings_by_process,
    new_master,
    reach_of,
    read_master,
    retire,
    rotate,
    write_secret_file,
)

keys_app = typer.Typer(
    help="Envelope signing keys: a master file per deployment, and a keyring per process "
    "(see docs/security.md). Secrets are never printed or logged.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
MasterPath = Annotated[
    Path,
    typer.Option(
        "--master",
        envvar="REDSAGA_MASTER_KEYS",
        help="The master file (env REDSAGA_MASTER_KEYS). Keep it where keys are made, never on a worker.",
    ),
]
KeyId = Annotated[
    str | None, typer.Option("--kid", help="The new key id (default: today's date, e.g. 2026-12-01).")
]


def _summary(master_path: Path, json_output: bool, what: str) -> None:
    rows = describe(read_master(master_path))
    if json_output:
        emit_json({"master": str(master_path), "keys": rows})
        return
    typer.echo(what)
    table = [[r["kid"], r["created"], "yes" if r["signs"] else ""] for r in rows]
    emit_table(["KEY ID", "CREATED", "SIGNS"], table)


@keys_app.command("generate")
@reporting_errors
def generate(master: MasterPath, kid: KeyId = None, json_output: Json = False) -> None:
    """Create a new master file with one key id (refuses to overwrite an existing file)."""
    write_secret_file(master, encode_master(new_master(kid=kid)), replace=False)
    _summary(master, json_output, f"master file {master} created (mode 0600); keep it off the workers")


@keys_app.command("rotate")
@reporting_errors
def rotate_keys(master: MasterPath, kid: KeyId = None, json_output: Json = False) -> None:
    """Add a key id to the master file; keyrings issued afterwards sign with it.

    Roll out in two steps (docs/security.md): issue and deploy keyrings that hold both key
    ids everywhere, then retire the old one and deploy again.
    """
    write_secret_file(master, encode_master(rotate(read_master(master), kid=kid)), replace=True)
    _summary(master, json_output, "key id added; issue the keyrings again and roll them out")


@keys_app.command("retire")
@reporting_errors
def retire_key(
    kid: Annotated[str, typer.Argument(help="The key id to remove.")],
    master: MasterPath,
    json_output: Json = False,
) -> None:
    """Remove a key id from the master file.

    Entries and resume tokens signed with it stop verifying once the keyrings issued
    afterwards are deployed.
    """
    write_secret_file(master, encode_master(retire(read_master(master), kid)), replace=True)
    _summary(master, json_output, f"key id {kid} retired; issue the keyrings again and roll them out")


@keys_app.command("list")
@reporting_errors
def list_keys(master: MasterPath, json_output: Json = False) -> None:
    """List the master file's key ids (never a secret); the newest signs."""
    _summary(master, json_output, f"key ids in {master}:")


def _publishes(given: list[str]) -> dict[str, list[str]]:
    """``--publishes SERVICE=STREAM`` as service name -> stream keys (a usage error if malformed)."""
    found: dict[str, list[str]] = {}
    for item in given:
        service, _, stream = item.partition("=")
        if not stream:
            raise typer.BadParameter(f"{item!r}: expected SERVICE=STREAM", param_hint="--publishes")
        try:
            key = Stream.named(stream).key
            principal("service", service)
        except (ValueError, AuthError) as error:
            raise typer.BadParameter(f"{item!r}: {error}", param_hint="--publishes") from None
        found.setdefault(service, []).append(key)
    return found


@keys_app.command("issue")
@reporting_errors
def issue(
    master: MasterPath,
    app_ref: Annotated[
        str, typer.Option("--app", envvar="REDSAGA_APP", help="The App (module:attribute, env REDSAGA_APP).")
    ],
    principal: Annotated[
        list[str] | None,
        typer.Option(
            "--principal",
            "-p",
            help="A principal this process runs, e.g. orchestrator:orders, participant:payments, "
            "client:web (repeatable); a context's orchestrator brings participant:tasks along (the task "
            "inbox runs in its worker). Default: one keyring file per process of the app.",
        ),
    ] = None,
    client: Annotated[
        list[str] | None, typer.Option("--client", help="A client principal to issue for (repeatable).")
    ] = None,
    operator: Annotated[
        list[str] | None, typer.Option("--operator", help="An operator principal to issue for (repeatable).")
    ] = None,
    publishes: Annotated[
        list[str] | None,
        typer.Option(
            "--publishes",
            metavar="SERVICE=STREAM",
            help="A stream whose domain events service:SERVICE publishes, through the outbox "
            "(relay.outbox.add) or a Bus (repeatable), e.g. payments=payments.events: its keyring "
            "gets the key for sending to it. The relay needs none: rows are signed as written.",
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Where to write: a file for --principal (- for stdout), else a directory (created "
            "if missing) with <principal>.keyring.json per principal.",
        ),
    ] = Path(),
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite existing keyring files.")] = False,
    json_output: Json = False,
) -> None:
    """Write the keyring of each process: set ``REDSAGA_KEYRING`` to its file there."""
    app = load_object(app_ref)
    if not isinstance(app, App):
        raise typer.BadParameter(f"{app_ref} is a {type(app).__name__}, not a saga.App", param_hint="--app")
    # one way to name any principal: -p client:web is --client web, and beside -p,
    # --client and --operator add their principals to the one file
    named = [
        *(principal or ()),
        *(f"client:{c}" for c in client or ()),
        *(f"operator:{o}" for o in operator or ()),
    ]
    clients = [p.removeprefix("client:") for p in named if p.startswith("client:")]
    operators = [p.removeprefix("operator:") for p in named if p.startswith("operator:")]
    reach = reach_of(app, clients=clients, operators=operators, publishes=_publishes(publishes or []))
    secrets = read_master(master)
    written: list[tuple[str, list[str]]] = []
    if principal:
        # a process named by its principal holds what the default per-process files give it
        # (a context's orchestrator runs its task inbox: participant:tasks too)
        by_process = keyrings_by_process(app, reach)
        held = list(dict.fromkeys(p for one in named for p in by_process.get(one, [one])))
        keyrings = issue_keyrings(secrets, reach, held)
        content = encode_keyrings(keyrings)
        if str(out) == "-":
            sys.stdout.buffer.write(content)
            return
        target = out / "keyring.json" if out.is_dir() else out
        write_secret_file(target, content, replace=replace)
        written.append((str(target), sorted(k.principal for k in keyrings)))
    else:
        if out.exists() and not out.is_dir():
            raise typer.BadParameter(
                f"{out} is not a directory (name one, or pass --principal)", param_hint="--out"
            )
        out.mkdir(mode=0o700, parents=True, exist_ok=True)  # it will hold secrets: owner only
        for name, held in keyrings_by_process(app, reach).items():
            target = out / f"{name.replace(':', '.')}.keyring.json"
            write_secret_file(target, encode_keyrings(issue_keyrings(secrets, reach, held)), replace=replace)
            written.append((str(target), held))
    if json_output:
        emit_json({"written": [{"file": f, "principals": p} for f, p in written]})
        return
    emit_table(["FILE", "PRINCIPALS"], [[f, ", ".join(p)] for f, p in written])
