"""``saga versions``: check shapes, snapshot the registry, list, drain, decommission, migrate.

Thin shells over :class:`saga.Versions`, :func:`saga.versions.records.check_registry` and
:func:`saga.run_migration`; see docs/versioning.md for the rules and the CI recipe.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import msgspec
import typer

import bus
from redsaga.cli._common import (
    CommandError,
    Json,
    RedisUrl,
    app_option,
    emit_json,
    emit_line,
    emit_table,
    reporting_errors,
    with_redis,
)
from redsaga.cli._load import load_app
from saga import Versions, run_migration
from saga.versions.compatibility import Change
from saga.versions.records import RegistrySnapshot, VersionStatus, check_registry, parse_key
from saga.versions.registry import IN_FLIGHT

versions_app = typer.Typer(
    help="Definition versions: check shapes against the registry, list, drain, decommission, migrate.",
    no_args_is_help=True,
)

AppRef = Annotated[str, app_option("The App whose definitions to use, as module:attribute.")]
ContextOption = Annotated[
    str | None, typer.Option("--context", help="The context (default: found from the version).")
]
By = Annotated[str, typer.Option("--by", help="Who does this (recorded).")]


def _default_by() -> str:
    return f"saga versions ({os.environ.get('USER', 'unknown')})"


def check(
    app_ref: AppRef,
    snapshot: Annotated[
        Path | None,
        typer.Option(
            "--snapshot",
            help="A registry snapshot file (saga versions snapshot) to check against, without Redis.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Compare the code's definitions with the registered shapes; exit 1 on a breaking change.

    Prints one line per problem, each saying what to do (make the version N+1). Safe
    changes (a step appended, a compensation added, a field added with a default) pass and
    are listed on stderr. Checks against Redis, or against --snapshot FILE in CI.
    """
    app = load_app(app_ref)
    if snapshot is not None:
        try:
            registry = msgspec.json.decode(snapshot.read_bytes(), type=RegistrySnapshot)
        except (msgspec.DecodeError, ValueError) as error:
            raise CommandError(f"{snapshot} is not a registry snapshot: {error}") from error
    else:
        if not (redis_url or os.environ.get(bus.URL_ENV)):
            raise CommandError(
                "give --redis-url (or REDSAGA_REDIS_URL) to check against the registry in Redis, "
                "or --snapshot FILE (written by 'saga versions snapshot')"
            )

        registry = with_redis(redis_url, lambda redis: Versions(redis).snapshot(app.registry.contexts))
    changes = check_registry(registry, app.registry)
    problems = [c for c in changes if c.breaking]
    if json_output:
        emit_json({"ok": not problems, "changes": changes})
    else:
        _report_check(changes, problems, len(app.registry))
    if problems:
        raise typer.Exit(1)


def _report_check(changes: list[Change], problems: list[Change], definitions: int) -> None:
    for change in problems:
        emit_line(change.line())
    for change in changes:
        if not change.breaking:
            emit_line(f"safe: {change.line()}", err=True)
    verdict = f"{len(problems)} breaking" if problems else "no breaking changes"
    emit_line(f"checked {definitions} definition version(s): {verdict}", err=True)


def snapshot(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file (default: stdout).")
    ] = None,
    contexts: Annotated[
        list[str] | None, typer.Option("--context", help="Only these contexts (repeat; default: all).")
    ] = None,
    redis_url: RedisUrl = None,
) -> None:
    """Write the registered shapes and in-flight counts as a file for 'saga versions check --snapshot'."""
    snapshot = with_redis(redis_url, lambda redis: Versions(redis).snapshot(contexts or None))
    text = msgspec.json.format(msgspec.json.encode(snapshot, order="sorted"), indent=2) + b"\n"
    if output is None:
        sys.stdout.write(text.decode())
    else:
        output.write_bytes(text)
        emit_line(f"wrote {output}", err=True)


def list_versions(
    context: ContextOption = None, redis_url: RedisUrl = None, json_output: Json = False
) -> None:
    """Every definition version: registered, drained, live workers, sagas per status.

    STRANDED marks a version with sagas in flight that no running worker serves.
    """
    rows = with_redis(redis_url, lambda redis: Versions(redis).status(context))
    if json_output:
        emit_json(rows)
        return
    statuses = [*IN_FLIGHT, "completed", "failed", "compensated", "cancelled"]
    emit_table(
        ["context", "saga", "version", "state", "workers", "in flight", *statuses],
        [
            [
                r.context,
                r.saga,
                r.version,
                _state(r),
                r.workers,
                r.in_flight,
                *(r.counts.get(s, 0) for s in statuses),
            ]
            for r in rows
        ],
    )


def _state(row: VersionStatus) -> str:
    words = ["registered" if row.registered else "unregistered"]
    if row.drained is not None:
        words.append("drained")
    if row.stranded:
        words.append("STRANDED")
    return ",".join(words)


def drain(
    version: Annotated[str, typer.Argument(help="name@version")],
    context: ContextOption = None,
    reason: Annotated[str, typer.Option(help="Why (recorded).")] = "",
    by: By = "",
    redis_url: RedisUrl = None,
) -> None:
    """Stop new starts on a version; sagas already running end on it."""
    name, number = parse_key(version)

    with_redis(
        redis_url,
        lambda redis: Versions(redis).drain(
            name, number, context=context, by=by or _default_by(), reason=reason
        ),
    )
    emit_line(f"{version} drained: new sagas may not start on it")


def undrain(
    version: Annotated[str, typer.Argument(help="name@version")],
    context: ContextOption = None,
    redis_url: RedisUrl = None,
) -> None:
    """Allow new starts on a drained version again."""
    name, number = parse_key(version)

    with_redis(redis_url, lambda redis: Versions(redis).undrain(name, number, context=context))
    emit_line(f"{version} undrained: new sagas may start on it")


def decommission(
    version: Annotated[str, typer.Argument(help="name@version")],
    context: ContextOption = None,
    redis_url: RedisUrl = None,
) -> None:
    """Unregister a drained version once no saga is in flight on it (refused before)."""
    name, number = parse_key(version)

    with_redis(redis_url, lambda redis: Versions(redis).decommission(name, number, context=context))
    emit_line(f"{version} decommissioned")


def migrate(
    name: Annotated[str, typer.Argument(help="The saga name.")],
    app_ref: AppRef,
    source: Annotated[int, typer.Option("--from", help="The version to move sagas from.")],
    target: Annotated[int, typer.Option("--to", help="The version to move them to.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Decide and report; change nothing.")] = False,
    limit: Annotated[int | None, typer.Option(help="Stop after this many sagas.")] = None,
    by: By = "",
    redis_url: RedisUrl = None,
    json_output: Json = False,
) -> None:
    """Move in-flight sagas to another version with the App's registered migration function.

    Each saga is moved atomically (or refused and left untouched) and records the migration
    in its history. Exit code 1 when any saga was refused.
    """
    app = load_app(app_ref)
    migration = app.migration(name, source, target)

    report = with_redis(
        redis_url,
        lambda redis: run_migration(redis, migration, dry_run=dry_run, limit=limit, by=by or _default_by()),
    )
    if json_output:
        emit_json(report)
    else:
        emit_table(
            ["saga", "status", "outcome", "step", "to step", "reason"],
            [[r.saga_id, r.status, r.outcome, r.step, r.to_step, r.reason] for r in report.results],
        )
        done = report.count("would_migrate" if dry_run else "migrated")
        verb = "would migrate" if dry_run else "migrated"
        emit_line(
            f"{migration.name}: {verb} {done}, refused {report.count('refused')}, "
            f"skipped {report.count('skipped')}; {report.remaining} still in flight on {name}@{source}",
            err=True,
        )
    if not report.ok:
        raise typer.Exit(1)


for _command, _name in (
    (check, "check"),
    (snapshot, "snapshot"),
    (list_versions, "list"),
    (drain, "drain"),
    (undrain, "undrain"),
    (decommission, "decommission"),
    (migrate, "migrate"),
):
    versions_app.command(_name)(reporting_errors(_command))
