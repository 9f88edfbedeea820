"""``saga relay``: run the outbox relay, create its tables, show its backlog and failed rows."""

from __future__ import annotations

import signal
from typing import Annotated, Literal

import anyio
import typer

import bus
import relay
from bus.metrics import DEFAULT_HOST
from redsaga.cli._common import (
    Json,
    RedisUrl,
    UsageProblem,
    emit_json,
    emit_line,
    emit_table,
    real_redis_url,
    reporting_errors,
    run,
)
from redsaga.cli._logging import ConsoleLogs, LogLevel, configure
from redsaga.cli._port import MetricsHost, MetricsPort, open_port
from relay import parse_dsn
from relay.metrics import RelayMetrics

relay_app = typer.Typer(
    help="The outbox relay: publishes committed outbox rows to their streams, exactly once per row. "
    "Without a subcommand, runs the relay until SIGTERM.",
    no_args_is_help=False,
)
DSN_ENVS = ["REDSAGA_RELAY_DSN", "REDSAGA_PG_DSN"]


def _dsn_option(text: str) -> str:
    """A DSN the relay can open (checked, not connected), or a usage error."""
    try:
        parse_dsn(text)
    except relay.InvalidDsn as error:
        raise typer.BadParameter(str(error), param_hint="'--dsn'") from None  # not click's env var list
    return text


def _tables_option(prefix: str) -> relay.Tables:
    try:
        return relay.Tables.prefixed(prefix)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


Dsn = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        envvar=DSN_ENVS,
        parser=_dsn_option,
        metavar="DSN",
        help="The outbox database: postgresql://user@host:port/db, libpq keywords "
        "('host=db dbname=payments') or sqlite:///path/to/file.db.",
        show_default=False,
    ),
]
Prefix = Annotated[
    relay.Tables | None,
    typer.Option(
        "--tables",
        parser=_tables_option,
        metavar="PREFIX",
        help="Table-name prefix: PREFIX_outbox, PREFIX_inbox, … (default: redsaga_outbox, …).",
        show_default=False,
    ),
]


def _required(dsn: str | None) -> str:
    if not dsn:
        raise UsageProblem(f"no outbox database given: pass --dsn DSN or set {DSN_ENVS[0]}")
    return dsn


@relay_app.callback(invoke_without_command=True)
@reporting_errors
def relay_main(
    ctx: typer.Context,
    *,
    dsn: Dsn = None,
    redis_url: RedisUrl = None,
    tables: Prefix = None,
    batch_size: Annotated[
        int, typer.Option(min=1, max=10_000, help="Rows per claim, pipeline and commit.")
    ] = 500,
    poll_interval: Annotated[
        float, typer.Option(help="Seconds between looks at an idle outbox (fallback to NOTIFY).")
    ] = 1.0,
    listen: Annotated[bool, typer.Option(help="Wake on PostgreSQL NOTIFY from the outbox trigger.")] = True,
    dedupe_window: Annotated[
        float, typer.Option(help="Seconds a published row's message id is remembered in Redis.")
    ] = 3600.0,
    retention: Annotated[
        float | None,
        typer.Option(min=0, help="Seconds sent rows are kept (default 7 days); 0 removes them at once."),
    ] = None,
    archive: Annotated[bool, typer.Option(help="Move expired sent rows to the archive table.")] = False,
    drain: Annotated[bool, typer.Option(help="Exit once no row is left unsent.")] = False,
    init_db: Annotated[bool, typer.Option("--init-db", help="Create or upgrade the tables first.")] = False,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = DEFAULT_HOST,
    log_level: LogLevel = "info",
    console_logs: ConsoleLogs = False,
    json: Json = False,
) -> None:
    """Run the relay (when no subcommand is given); logs go to stderr as JSON lines.

    Database and Redis outages are logged and waited out. On SIGTERM or SIGINT the round in
    flight finishes, then the relay prints what it did (sent, repeats, failed, outages).

    With --metrics-port the relay serves Prometheus metrics on /metrics (its outbox's backlog
    and oldest unsent row, read from the database at scrape time), /healthz (the process
    runs) and /readyz (the database and Redis answer, the epoch is the one it saw first);
    `saga health ready` asks /readyz (docs/operations.md lists the metrics).
    """
    if ctx.invoked_subcommand is not None:
        return
    outbox, url = _required(dsn), real_redis_url(redis_url)
    defaults = relay.RelayConfig()
    try:
        config = relay.RelayConfig(
            tables=tables or relay.Tables(),
            batch_size=batch_size,
            poll_interval_s=poll_interval,
            listen=listen,
            dedupe_window_s=dedupe_window,
            retention_s=defaults.retention_s if retention is None else retention,
            retention_mode="archive" if archive else "delete",
        )
    except ValueError as error:
        raise UsageProblem(str(error)) from None
    configure(json_logs=not console_logs, level=log_level)
    port = None if metrics_port is None else (metrics_host, metrics_port)
    counters = run(lambda: _run_relay(outbox, url, config, drain=drain, init=init_db, port=port))
    if json:
        emit_json(counters)
    else:
        emit_table(
            ["sent", "repeats", "failed", "outages"],
            [[counters.sent, counters.repeats, counters.failed, counters.outages]],
        )


async def _run_relay(
    dsn: str,
    redis_url: str,
    config: relay.RelayConfig,
    *,
    drain: bool,
    init: bool,
    port: tuple[str, int] | None,
) -> relay.RelayCounters:
    if init:
        await relay.init_db(dsn, config.tables)
    redis = bus.connect(redis_url)
    worker = relay.Relay.connect(dsn, redis, config=config)
    try:
        async with anyio.create_task_group() as tasks:
            if port is not None:
                host, number = port
                await open_port(tasks, RelayMetrics(worker).server(host=host, port=number))

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
@reporting_errors
def init_db_command(dsn: Dsn = None, tables: Prefix = None, json: Json = False) -> None:
    """Create or upgrade the outbox, inbox and archive tables (idempotent)."""
    outbox = _required(dsn)
    applied = run(lambda: relay.init_db(outbox, tables))
    version = relay.latest_version()
    if json:
        emit_json({"applied": applied, "version": version})
    elif applied:
        emit_line(f"applied migrations {', '.join(map(str, applied))}; schema at v{version}")
    else:
        emit_line(f"schema already at v{version}; nothing to do")


@relay_app.command("ddl")
@reporting_errors
def ddl_command(
    dialect: Annotated[
        Literal["postgresql", "sqlite"], typer.Option(help="Which database's DDL.")
    ] = "postgresql",
    tables: Prefix = None,
) -> None:
    """Print the DDL that init-db applies, for teams that run their own migrations."""
    typer.echo(relay.ddl(dialect, tables or relay.Tables()), nl=False)  # SQL text, not values


@relay_app.command("stats")
@reporting_errors
def stats_command(dsn: Dsn = None, tables: Prefix = None, json: Json = False) -> None:
    """Show the outbox backlog and the age of its oldest unsent row."""
    outbox = _required(dsn)
    stats = run(lambda: relay.outbox_stats(outbox, tables=tables))
    if json:
        emit_json(stats)
        return
    age = "-" if stats.oldest_unsent_age_ms is None else f"{stats.oldest_unsent_age_ms / 1000:.1f}s"
    emit_table(["backlog", "oldest unsent", "failed"], [[stats.backlog, age, stats.failed]])


@relay_app.command("failed")
@reporting_errors
def failed_command(
    dsn: Dsn = None,
    tables: Prefix = None,
    limit: Annotated[int, typer.Option(min=1, help="Most rows to show.")] = 100,
    json: Json = False,
) -> None:
    """List the rows the relay could not publish, with the reason."""
    outbox = _required(dsn)
    rows = run(lambda: relay.failed_rows(outbox, tables=tables, limit=limit))
    if json:
        emit_json(rows)
        return
    emit_table(["id", "type", "stream", "error"], [[r.id, r.type, r.stream, r.error] for r in rows])


@relay_app.command("requeue")
@reporting_errors
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
    outbox = _required(dsn)
    count = run(lambda: relay.requeue_failed(outbox, None if every else list(ids or []), tables=tables))
    if json:
        emit_json({"requeued": count})
    else:
        emit_line(f"{count} row(s) pending again")
