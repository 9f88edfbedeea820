"""The operations commands: inspect, list, replay, force-complete, cancel, retry, export, stats, start.

Each parses its options, makes one :class:`saga.SagaAdmin` call and prints a table (or JSON
with ``--json``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from redsaga.cli import _show
from redsaga.cli._common import CommandError, Json, RedisUrl, emit_json, emit_line, emit_text
from redsaga.cli._format import duration_option
from redsaga.cli._session import QUEUED_EXIT, AppRef, By, ContextName, Reason, Wait, with_admin
from saga import SagaAdmin, SagaStatus, StartPending
from saga.ops.operator_actions import ActionResult
from saga.ops.trace import encode_trace

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
    exit code 1. --json prints the inspection (history_omitted is true unless --history;
    graph holds the diagram with --graph).
    """
    found = with_admin(
        redis_url,
        app,
        lambda admin: admin.inspect(saga_id, context=context, history=history, graph=fmt if graph else None),
    )
    if json:
        emit_json(found)
    elif found.graph is not None:
        emit_text(found.graph)
    else:
        _show.inspection(found, history=history)


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
    not moved for that long, stalest first (from an index, not a scan), leaving out those
    waiting within their wait's deadline (counted as waiting). Paginated with --limit and
    --offset; --count prints counts per definition and status instead. An unknown
    --definition or --context: exit code 1.
    """
    filters = {
        "status": list(status or []),
        "definition": definition,
        "version": version,
        "context": context,
        "stuck_for_ms": stuck_ms,
    }
    if count:
        tally = with_admin(redis_url, app, lambda admin: admin.tally(**filters))  # type: ignore[arg-type]
        if json:
            emit_json(tally)
        else:
            _show.tally(tally)
        return
    found = with_admin(redis_url, app, lambda admin: admin.list(**filters, offset=offset, limit=limit))  # type: ignore[arg-type]
    if json:
        emit_json(found)
    else:
        _show.page(found)


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
    Needs --app: the decider runs the definition's code.
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

    The output is validated against the step's output type before anything is sent (its
    registered JSON schema without --app); the action is refused (exit 1, nothing changed)
    if the saga moved on. A step whose compensation failed is marked compensated instead.
    --dry-run needs --app.
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
    and the final state; saga.testing.replay_trace replays it against the current code. Always
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
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            min=0,
            help="Seconds to wait for the orchestrator's verdict on a start by request (signing on, "
            f"no orchestrator keyring here). Exit code {QUEUED_EXIT} if it is still undecided.",
        ),
    ] = 10.0,
    no_wait: Annotated[
        bool,
        typer.Option("--no-wait", help="Return once the start request is stored (fire and forget)."),
    ] = False,
    app: AppRef = None,
    redis_url: RedisUrl = None,
    json: Json = False,
) -> None:
    """Start a saga by hand; prints its id once it exists. Needs --app (the data is checked).

    With --id, starting an existing saga with equal data prints its id (exit 0); with other
    data it is an error naming the saga (exit 1), and the new data is not stored. With
    signing on and no orchestrator keyring, the start is a request that the orchestrator
    decides: the command waits for its verdict (the id, or the refusal's reason with exit 1;
    exit 3 when none came within --wait). --no-wait prints the id once the request is stored.
    """
    wait_s = 0.0 if no_wait else wait

    async def job(admin: SagaAdmin) -> str:
        try:
            return await admin.start(definition, data, saga_id=saga_id, wait_s=wait_s)
        except StartPending as pending:
            emit_line(f"error: {pending}", fg=typer.colors.YELLOW, err=True)
            raise typer.Exit(QUEUED_EXIT) from pending

    started = with_admin(redis_url, app, job)
    if json:
        emit_json({"id": started})
    else:
        emit_line(started)
