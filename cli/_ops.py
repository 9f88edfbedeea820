"""The operations commands: inspect, list, replay, force-complete, cancel, retry, export, stats, start.

Each parses its options, makes one :class:`saga.SagaAdmin` call and prints a table (or JSON
with ``--json``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import typer

from cli import _show
from cli._common import CommandError, Json, RedisUrl, emit_json, emit_line, emit_text
from cli._format import ago, duration_option, printable
from cli._session import QUEUED_EXIT, AppRef, By, ContextName, Reason, Wait, with_admin
from saga import ActionResult, SagaAdmin, SagaStatus, encode_trace
from saga._graph import path_graph

SagaId = Annotated[str, typer.Argument(help="The saga's id.", show_default=False)]
Format = Annotated[Literal["mermaid", "dot"], typer.Option("--format", help="Diagram format for --graph.")]


def _finish(result: ActionResult, json: bool) -> None:
    if json:
        emit_json(result)
    else:
        _show.action(result)
    if result.outcome == "queued":
        raise typer.Exit(QUEUED_EXIT)


def inspect(
    saga_id: SagaId,
    history: Annotated[
        bool, typer.Option("--history", help="The full event list, with every attempt's input.")
    ] = False,
    graph: Annotated[
        bool, typer.Option("--graph", help="Draw the saga's path over its definition's diagram.")
    ] = False,
    fmt: Format = "mermaid",
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Show a saga: where it is, what it waits for, and why.

    Status, definition and version, the current step and what it waits for, every step with
    its attempts (input, output or error, timings, worker), pending timers, the last error
    with its chain, dead letters naming the saga, and the history timeline. Unknown id:
    exit code 1.
    """

    async def job(admin: SagaAdmin) -> tuple[object, str]:
        found = await admin.inspect(saga_id, context=context, history=history)
        diagram = ""
        if graph:
            state = await admin.get(saga_id, context=context)
            # The diagram's title line names the saga: its id escaped, or a newline in it splits the line.
            titled = msgspec.structs.replace(state, id=printable(state.id))
            diagram = path_graph(admin.registry.get(state.name, state.version), titled, fmt)
        return found, diagram

    found, diagram = with_admin(redis_url, app, job)
    if graph and not json:
        emit_text(diagram)
    elif json:
        emit_json({"inspection": found, "graph": diagram} if graph else found)
    else:
        _show.inspection(found, history=history)  # type: ignore[arg-type]


def list_sagas(
    status: Annotated[
        list[SagaStatus] | None,
        typer.Option("--status", "-s", help="Only sagas in this status (repeat for several)."),
    ] = None,
    definition: Annotated[str | None, typer.Option("--definition", help="Only this definition name.")] = None,
    version: Annotated[int | None, typer.Option("--version", help="Only this definition version.")] = None,
    stuck_ms: Annotated[
        int | None,
        typer.Option(
            "--stuck-for",
            parser=duration_option,
            metavar="DURATION",
            help="Only sagas that have not moved for this long (10m, 2h, 1d), stalest first.",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="Sagas per page.")] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0, help="Skip this many (for the next page).")] = 0,
    count: Annotated[bool, typer.Option("--count", help="Print counts instead of sagas.")] = False,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """List sagas by status, definition and version, or those stuck for a while.

    Any status can be asked for, dead_lettered included. --stuck-for lists sagas that have
    not moved for that long, stalest first (from an index, not a scan). Paginated with
    --limit and --offset; --count prints counts instead.
    """
    statuses = list(status or [])

    async def job(admin: SagaAdmin) -> tuple[object, int | None]:
        filters = {"status": statuses, "definition": definition, "version": version, "context": context}
        if count and stuck_ms is None:
            rows = await admin.counts(context=context)
            keep = [
                r
                for r in rows
                if (not statuses or r.status in statuses)
                and definition in (None, r.definition)
                and version in (None, r.version)
            ]
            return keep, None
        total = await admin.count(**filters, stuck_for_ms=stuck_ms)  # type: ignore[arg-type]
        if count:
            return None, total
        found = await admin.list(**filters, stuck_for_ms=stuck_ms, offset=offset, limit=limit)  # type: ignore[arg-type]
        return found, total

    found, total = with_admin(redis_url, app, job)
    if json:
        emit_json(found if found is not None else {"count": total})
    elif count and found is not None:
        _show.counts(found)  # type: ignore[arg-type]
    elif count:
        emit_line(f"{total} saga(s) not moved for {ago(stuck_ms)}")
    else:
        _show.page(found, total)  # type: ignore[arg-type]


def replay(
    saga_id: SagaId,
    from_step: Annotated[
        str | None,
        typer.Option(
            "--from-step",
            help="Re-run the stuck saga from this step, keeping earlier outputs (the redrive after a fix).",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what --from-step would send; send nothing.")
    ] = False,
    reason: Annotated[
        str, typer.Option("--reason", help="Why (required with --from-step unless --dry-run).")
    ] = "",
    by: By = None,
    wait: Wait = 10.0,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Check that today's code decides a saga's history the same; or redrive it from a step.

    Rebuilds the saga from its history through the decider, calling no participant, and
    reports the first decision that differs from the recorded one (exit 1 if any does).

    With --from-step, then re-run the saga from that step with the earlier steps' outputs
    kept: allowed while it runs or is dead-lettered on a forward step, from a step it has
    reached. A step whose attempts all failed gets a fresh idempotency key; any other keeps
    its key, so a participant answers with what it already did (see docs/operations.md).
    """
    if from_step is not None and not dry_run and not reason.strip():
        raise CommandError("--from-step needs --reason (it is recorded in the history)")

    async def job(admin: SagaAdmin) -> tuple[object, ActionResult | None]:
        report = await admin.replay(saga_id, context=context)
        if from_step is None:
            return report, None
        result = await admin.redrive(
            saga_id, from_step, reason=reason or "dry run", context=context, wait_s=wait, dry_run=dry_run
        )
        return report, result

    report, result = with_admin(redis_url, app, job, by=by, wait_s=wait)
    if json:
        emit_json({"replay": report, "redrive": result} if from_step else report)
    else:
        _show.replay(report)  # type: ignore[arg-type]
        if result is not None:
            emit_line()
            _show.action(result)
    if result is not None and result.outcome == "queued":
        raise typer.Exit(QUEUED_EXIT)
    if from_step is None and report.mismatch is not None:  # type: ignore[attr-defined]
        raise typer.Exit(1)


def force_complete(
    saga_id: SagaId,
    step: Annotated[
        str, typer.Option("--step", help="The stuck step (or the step whose compensation failed).")
    ],
    output: Annotated[
        str, typer.Option("--output", help="The step's output as JSON (checked against its type).")
    ],
    reason: Annotated[
        str, typer.Option("--reason", help="Why (required; recorded with --by in the history).")
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check and show the outcome; send nothing.")
    ] = False,
    by: By = None,
    wait: Wait = 10.0,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Mark a stuck or dead-lettered step succeeded with an output; the saga continues.

    The output is validated against the step's output type before anything is sent; the
    action is refused (exit 1, nothing changed) if the saga moved on. A step whose
    compensation failed is marked compensated instead.
    """
    result = with_admin(
        redis_url,
        app,
        lambda admin: admin.force_complete(
            saga_id, step, output, reason=reason, context=context, wait_s=wait, dry_run=dry_run
        ),
        by=by,
        wait_s=wait,
    )
    _finish(result, json)


def cancel(
    saga_id: SagaId,
    reason: Reason = "",
    by: By = None,
    wait: Wait = 10.0,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Cancel a saga: its completed steps are compensated in reverse order."""
    result = with_admin(
        redis_url,
        app,
        lambda admin: admin.cancel(saga_id, reason=reason, context=context),
        by=by,
        wait_s=wait,
    )
    _finish(result, json)


def retry(
    saga_id: SagaId,
    reason: Reason = "",
    by: By = None,
    wait: Wait = 10.0,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Retry a dead-lettered saga's failed step (or failed compensation) now."""
    result = with_admin(
        redis_url, app, lambda admin: admin.retry(saga_id, reason=reason, context=context), by=by, wait_s=wait
    )
    _finish(result, json)


def export(
    saga_id: SagaId,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the trace here instead of stdout.")
    ] = None,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Write a saga's trace as JSON, for replay in CI.

    The trace holds the definition version, the input data, every event with its outputs
    and the final state; saga.replay_trace replays it against the current code. Always
    JSON (--json is accepted).
    """
    del json
    trace = with_admin(redis_url, app, lambda admin: admin.export(saga_id, context=context))
    encoded = encode_trace(trace)
    if output is None:
        sys.stdout.write(encoded.decode())
    else:
        output.write_bytes(encoded)
        emit_line(f"wrote the trace of {saga_id} ({len(trace.history)} events) to {output}", err=True)


def stats(
    stuck_ms: Annotated[
        int,
        typer.Option(
            "--stuck-for",
            parser=duration_option,
            metavar="DURATION",
            show_default="10m",
            help="Count sagas not moved for this long (10m, 2h, 1d).",
        ),
    ] = 600_000,
    dsn: Annotated[
        list[str] | None,
        typer.Option(
            "--dsn", help="An outbox database whose backlog to report (repeatable).", show_default=False
        ),
    ] = None,
    stream: Annotated[
        list[str] | None, typer.Option("--stream", help="Another stream key to report (repeatable).")
    ] = None,
    app: AppRef = None,
    context: ContextName = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Sagas in flight, queue depths, dead letters, stuck sagas and outbox backlogs.

    Sagas per definition, version and state; per stream its length, and per consumer group
    the pending entries, lag and oldest-pending age; dead letters per partition; how many
    sagas have not moved for --stuck-for; the backlog of each outbox database given --dsn.
    """
    found = with_admin(
        redis_url,
        app,
        lambda admin: admin.stats(
            context=context, stuck_for_ms=stuck_ms, dsns=dsn or [], streams=stream or []
        ),
    )
    if json:
        emit_json(found)
    else:
        _show.stats(found)


def start(
    definition: Annotated[str, typer.Argument(help="The saga definition: name or name@version.")],
    data: Annotated[str, typer.Option("--data", help="The saga's data as JSON (checked against its type).")],
    saga_id: Annotated[
        str | None, typer.Option("--id", help="The saga id (starting the same id twice returns the saga).")
    ] = None,
    app: AppRef = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Start a saga by hand; prints its id."""
    started = with_admin(redis_url, app, lambda admin: admin.start(definition, data, saga_id=saga_id))
    if json:
        emit_json({"id": started})
    else:
        emit_line(started)
