"""``saga functions load|list|prune``: the Redis Functions libraries redsaga's scripts run as.

Each package's Lua scripts are one library named by a hash of its text
(``redsaga_<package>_<hash8>``, see ``bus/_scripts.py``), so releases load side by side.
Workers load a missing library themselves when their Redis user may (``function|load``);
least-privilege users may not, so an admin runs ``saga functions load`` before the workers
of a release start. See docs/operations.md for the rolling-upgrade order.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec
import typer

import bus
from bus.lowlevel import Library, delete_library, library, load_libraries, loaded_libraries
from redsaga.cli._common import (
    CommandError,
    Json,
    emit_json,
    emit_table,
    reporting_errors,
    with_redis,
)

PACKAGES: Final = ("bus", "saga.store", "relay")
"""The packages with Lua scripts: one library each."""

AdminUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar=bus.URL_ENV,
        help="The Redis, as a user that may manage functions (FUNCTION LOAD, LIST, DELETE: an admin "
        "user, not a worker's; env REDSAGA_REDIS_URL).",
        show_default=False,
    ),
]

functions_app = typer.Typer(
    help="The Redis Functions libraries redsaga's Lua scripts run as, one per package, named by a "
    "hash of their code so that releases load side by side. Load this release's before its "
    "workers start (their users may not load functions); prune other releases' once none of "
    "their workers runs.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def libraries() -> list[Library]:
    """This release's libraries (bus, saga, relay)."""
    return [library(package) for package in PACKAGES]


@functions_app.command("load")
@reporting_errors
def load(redis_url: AdminUrl = None, json_output: Json = False) -> None:
    """Load this release's libraries; a library loaded already is left as it is.

    Safe to repeat and to run while workers run. Needs a user allowed `FUNCTION LOAD`.

    `--json`: `{"libraries": [{"name", "package", "version", "loaded_now"}]}`, where
    `loaded_now` is false for a library that was there already.
    """
    wanted = libraries()

    async def job(redis: bus.Redis) -> list[bool]:
        try:
            return await load_libraries(redis, wanted)
        except bus.LibraryNotLoaded as error:
            raise CommandError(
                "this Redis user may not load functions (it needs function|load): run it as an admin user"
            ) from error

    loaded_now = with_redis(redis_url, job)
    if json_output:
        emit_json(
            {"libraries": [_row(lib, loaded_now=now) for lib, now in zip(wanted, loaded_now, strict=True)]}
        )
        return
    for lib, now in zip(wanted, loaded_now, strict=True):
        typer.echo(f"{lib.name}  {'loaded' if now else 'loaded already'}")


class Listed(msgspec.Struct):
    """One line of ``saga functions list``."""

    name: str
    package: str
    version: str
    functions: list[str]
    """The function names (empty when not loaded)."""
    this_release: bool
    loaded: bool


@functions_app.command("list")
@reporting_errors
def list_libraries(redis_url: AdminUrl = None, json_output: Json = False) -> None:
    """List the redsaga libraries on Redis, this release's and other releases'.

    A library of this release that is missing is listed as not loaded. Needs a user allowed
    `FUNCTION LIST`.

    `--json`: `{"libraries": [{"name", "package", "version", "functions", "this_release",
    "loaded"}]}`, `functions` the function names (empty when not loaded).
    """
    found = with_redis(redis_url, loaded_libraries)
    current = {lib.name: lib for lib in libraries()}
    rows = [
        Listed(o.name, o.package, o.version, list(o.functions), o.name in current, loaded=True) for o in found
    ]
    on_redis = {o.name for o in found}
    rows += [
        Listed(lib.name, lib.package, lib.version, [], this_release=True, loaded=False)
        for lib in current.values()
        if lib.name not in on_redis
    ]
    rows.sort(key=lambda row: (row.package, row.name))
    if json_output:
        emit_json({"libraries": rows})
        return
    emit_table(
        ["library", "package", "functions", "this release", "loaded"],
        [[r.name, r.package, len(r.functions), _yes(r.this_release), _yes(r.loaded)] for r in rows],
    )


@functions_app.command("prune")
@reporting_errors
def prune(
    redis_url: AdminUrl = None,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", help="Confirm: no worker, client or relay of another redsaga release still runs."
        ),
    ] = False,
    json_output: Json = False,
) -> None:
    """Delete the redsaga libraries of other releases, after a rolling upgrade finished.

    Run it with the release the workers now run. Refused (exit 1, nothing deleted) without
    `--yes` when there is something to delete, and when this release's libraries are not
    all loaded (its workers cannot be the ones running: run `saga functions load` first, or
    use the workers' release). A process of another release still running fails every call
    once its library is gone (or loads it again, if its user may). Needs a user allowed
    `FUNCTION LIST` and `FUNCTION DELETE`.

    `--json`: `{"deleted": [names], "kept": [names]}`, `kept` this release's libraries.
    """
    current = sorted(lib.name for lib in libraries())

    async def job(redis: bus.Redis) -> list[str]:
        found = [o.name for o in await loaded_libraries(redis)]
        missing = [name for name in current if name not in found]
        if missing:
            raise CommandError(
                f"this release's libraries are not loaded ({', '.join(missing)}): run `saga functions "
                "load` first, or prune with the release the workers run; nothing deleted"
            )
        others = [name for name in found if name not in current]
        if others and not yes:
            raise CommandError(
                f"pruning deletes the libraries of other releases ({', '.join(others)}); their processes "
                "fail every call afterwards: pass --yes once none runs; nothing deleted"
            )
        for name in others:
            await delete_library(redis, name)
        return others

    deleted = with_redis(redis_url, job)
    if json_output:
        emit_json({"deleted": deleted, "kept": current})
        return
    for name in deleted:
        typer.echo(f"deleted {name}")
    typer.echo(f"kept this release's {', '.join(current)}")


def _row(lib: Library, *, loaded_now: bool) -> dict[str, object]:
    return {"name": lib.name, "package": lib.package, "version": lib.version, "loaded_now": loaded_now}


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
