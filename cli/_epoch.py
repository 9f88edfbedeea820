"""``saga epoch show|accept``: the key that tells workers Redis still holds their data."""

from __future__ import annotations

from typing import Annotated

import typer

import bus
from redsaga.cli._common import Json, RedisUrl, emit_json, emit_line, reporting_errors, with_redis

epoch_app = typer.Typer(
    help="The deployment's epoch (rs:epoch): workers stop when it vanishes (Redis restarted "
    "empty or was flushed) and refuse to start until an operator accepts a fresh one.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


@epoch_app.command("show")
@reporting_errors
def show(redis_url: RedisUrl = None, json_output: Json = False) -> None:
    """Print the epoch: an id, `lost:<id>` after a loss was seen, or none before any worker ran."""
    epoch = with_redis(redis_url, bus.read_epoch)
    lost = epoch is not None and epoch.startswith("lost:")
    if json_output:
        emit_json({"epoch": epoch, "lost": lost})
    elif epoch is None:
        emit_line("no epoch yet: the first worker to start creates one")
    else:
        seen = "  (data loss seen: workers refuse to start; see saga epoch accept)" if lost else ""
        emit_line(f"{epoch}{seen}")


@epoch_app.command("accept")
@reporting_errors
def accept(
    redis_url: RedisUrl = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Confirm: Redis holds the data workers should go on with.")
    ] = False,
    json_output: Json = False,
) -> None:
    """Start a fresh epoch, after restoring a backup or deciding to go on with what Redis holds.

    Workers that saw the loss have stopped; start them again afterwards. Sagas whose state
    vanished are gone: start them again from their business keys.
    """
    if not yes:
        raise typer.BadParameter("accepting a new epoch needs --yes", param_hint="--yes")
    epoch = with_redis(redis_url, bus.accept_epoch)
    if json_output:
        emit_json({"epoch": epoch})
    else:
        emit_line(f"new epoch {epoch}: start the workers again")
