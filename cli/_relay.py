"""``saga relay``: run the outbox relay, create its tables, show its backlog and failed rows."""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, TypeVar

import anyio
import structlog
import typer

import bus
import relay
from cli._common import CommandError, Json, RedisUrl, emit_json, emit_table, run

T = TypeVar("T")

relay_app = typer.Typer(
    help="The outbox relay: publishes committed outbox rows to their streams, exactly once per row. "
    "Without a subcommand, runs the relay until SIGTERM.",
    no_args_is_help=False,
)

Dsn = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        envvar=["REDSAGA_RELAY_DSN", "REDSAGA_PG_DSN"],
        help="The outbox database: postgresql://user@host:port/db or sqlite:///path/to/file.db.",
        show_default=False,
    ),
]
Prefix = Annotated[
    str | None,
    typer.Option(
        "--tables",
        help="Table-name prefix: PREFIX_outbox, PREFIX_inbox, … (default: redsaga_outbox, …).",
        show_default=False,
    ),
]


def _run(job: Callable[[], Awaitable[T]]) -> T:
    """:func:`cli._common.run`, with the relay's errors reported as one line too."""

    async def guarded() -> T:
        try:
            return await job()
        except relay.RelayError as error:
            raise CommandError(str(error)) from error

    return run(guarded)


def _tables(prefix: str | None) -> relay.Tables:
    return relay.Tables.prefixed(prefix) if prefix else relay.Tables()


def _dsn(dsn: str | None) -> str:
    if not dsn:
        raise CommandError("no database given: pass --dsn (or set REDSAGA_RELAY_DSN)")
    return dsn


@relay_app.callback(invoke_without_command=True)
def relay_main(
    ctx: typer.Context,
    *,
    dsn: Dsn = None,
    redis_url: RedisUrl = None,
    tables: Prefix = None,
    batch_size: Annotated[int, typer.Option(help="Rows per claim, pipeline and commit.")] = 500,
    poll_interval: Annotated[
        float, typer.Option(help="Seconds between looks at an idle outbox (fallback to NOTIFY).")
    ] = 1.0,
    listen: Annotated[bool, typer.Option(help="Wake on PostgreSQL NOTIFY from the outbox trigger.")] = True,
    dedupe_window: Annotated[
        float, typer.Option(help="Seconds a published row's message id is remembered in Redis.")
    ] = 3600.0,
    retention: Annotated[
        float | None,
        typer.Option(help="Seconds sent rows are kept (default 7 days); 0 removes them at once."),
    ] = None,
    archive: Annotated[bool, typer.Option(help="Move expired sent rows to the archive table.")] = False,
    drain: Annotated[bool, typer.Option(help="Exit once no row is left unsent.")] = False,
    init_db: Annotated[bool, typer.Option("--init-db", help="Create or upgrade the tables first.")] = False,
    json: Json = False,
) -> None:
    """Run the relay (when no subcommand is given)."""
    if ctx.invoked_subcommand is not None:
        return
    defaults = relay.RelayConfig()
    config = relay.RelayConfig(
        tables=_tables(tables),
        batch_size=batch_size,
        poll_interval_s=poll_interval,
        listen=listen,
        dedupe_window_s=dedupe_window,
        retention_s=defaults.retention_s if retention is None else retention,
        retention_mode="archive" if archive else "delete",
    )
    counters = _run(
        lambda: _run_relay(_dsn(dsn), bus.resolve_url(redis_url), config, drain=drain, init=init_db)
    )
    if json:
        emit_json(counters)
    else:
        emit_table(
            ["sent", "repeats", "failed", "outages"],
            [[counters.sent, counters.repeats, counters.failed, counters.outages]],
        )


async def _run_relay(
    dsn: str, redis_url: str, config: relay.RelayConfig, *, drain: bool, init: bool
) -> relay.RelayCounters:
    if redis_url.startswith(bus.MEMORY_URL):
        raise CommandError("the relay publishes to a real Redis: pass --redis-url or set REDSAGA_REDIS_URL")
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    if init:
        await relay.init_db(dsn, config.tables)
    redis = bus.connect(redis_url)
    worker = relay.Relay.connect(dsn, redis, config=config)
    try:
        async with anyio.create_task_group() as tasks:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        worker.stop()

            tasks.start_soon(stop_on_signal)
            await worker.run(drain=drain)
            tasks.cancel_scope.cancel()
    finally:
        await redis.aclose()
    return worker.counters


@relay_app.command("init-db")
def init_db_command(dsn: Dsn = None, tables: Prefix = None, json: Json = False) -> None:
    """Create or upgrade the outbox, inbox and archive tables (idempotent)."""
    applied = _run(lambda: relay.init_db(_dsn(dsn), _tables(tables)))
    version = relay.latest_version()
    if json:
        emit_json({"applied": applied, "version": version})
    elif applied:
        typer.echo(f"applied migrations {', '.join(map(str, applied))}; schema at v{version}")
    else:
        typer.echo(f"schema already at v{version}; nothing to do")


@relay_app.command("ddl")
def ddl_command(
    dialect: Annotated[
        Literal["postgresql", "sqlite"], typer.Option(help="Which database's DDL.")
    ] = "postgresql",
    tables: Prefix = None,
) -> None:
    """Print the DDL that init-db applies, for teams that run their own migrations."""
    typer.echo(relay.ddl(dialect, _tables(tables)), nl=False)


@relay_app.command("stats")
def stats_command(dsn: Dsn = None, tables: Prefix = None, json: Json = False) -> None:
    """Show the outbox backlog and the age of its oldest unsent row."""
    stats = _run(lambda: relay.outbox_stats(_dsn(dsn), tables=_tables(tables)))
    if json:
        emit_json(stats)
        return
    age = "-" if stats.oldest_unsent_age_ms is None else f"{stats.oldest_unsent_age_ms / 1000:.1f}s"
    emit_table(["backlog", "oldest unsent", "failed"], [[stats.backlog, age, stats.failed]])


@relay_app.command("failed")
def failed_command(
    dsn: Dsn = None,
    tables: Prefix = None,
    limit: Annotated[int, typer.Option(help="Most rows to show.")] = 100,
    json: Json = False,
) -> None:
    """List the rows the relay could not publish, with the reason."""

    async def job() -> list[relay.FailedRow]:
        worker = relay.Relay.connect(
            _dsn(dsn), bus.connect(bus.MEMORY_URL), config=relay.RelayConfig(tables=_tables(tables))
        )
        try:
            return await worker.failed_rows(limit)
        finally:
            await worker.close()

    rows = _run(job)
    if json:
        emit_json(rows)
        return
    emit_table(["id", "type", "stream", "error"], [[r.id, r.type, r.stream, r.error] for r in rows])


@relay_app.command("requeue")
def requeue_command(
    ids: Annotated[list[int] | None, typer.Argument(help="Ids of failed rows to publish again.")] = None,
    dsn: Dsn = None,
    tables: Prefix = None,
    every: Annotated[bool, typer.Option("--all", help="Requeue every failed row.")] = False,
    json: Json = False,
) -> None:
    """Mark failed rows pending again, after fixing what made them fail."""
    if not ids and not every:
        raise typer.BadParameter("give the ids of failed rows, or --all")

    async def job() -> int:
        worker = relay.Relay.connect(
            _dsn(dsn), bus.connect(bus.MEMORY_URL), config=relay.RelayConfig(tables=_tables(tables))
        )
        try:
            return await worker.requeue(None if every else list(ids or []))
        finally:
            await worker.close()

    count = _run(job)
    if json:
        emit_json({"requeued": count})
    else:
        typer.echo(f"{count} row(s) pending again")
