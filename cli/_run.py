"""``saga worker`` and ``saga demo``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

import bus
from bus.lowlevel import redis_errors
from bus.metrics import DEFAULT_HOST
from redsaga.cli._common import (
    CommandError,
    Json,
    RedisUrl,
    app_option,
    emit_json,
    emit_line,
    emit_table,
    real_redis_url,
    run,
)
from redsaga.cli._format import cell, duration_option, partitions_option, status_colour
from redsaga.cli._load import load_app
from redsaga.cli._logging import ConsoleLogs, LogLevel, configure
from redsaga.cli._port import MetricsHost, MetricsPort, open_port
from saga import EngineConfig, SagaWorker
from saga.errors import PartitionOutOfRange
from saga.metrics import DEFAULT_STUCK_FOR_MS, WorkerMetrics
from saga.ops.text import printable
from saga.runtime.gc_tuning import tune_gc

if TYPE_CHECKING:
    from redsaga.examples.demo import DemoReport

_DEFAULTS = bus.BusConfig()


DemoRedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar=bus.URL_ENV,
        help="The Redis to run on (redis://, or rediss:// for TLS). Default: an embedded in-memory one.",
        show_default=False,
    ),
]


def worker(
    app_ref: Annotated[str, app_option("The App to run, as module:attribute.")],
    redis_url: RedisUrl = None,
    concurrency: Annotated[
        int, typer.Option(help="Handler slots (entries handled at once).")
    ] = _DEFAULTS.concurrency,
    lease_ms: Annotated[
        int, typer.Option(help="Lease on an entry; a silent worker loses it after this.")
    ] = _DEFAULTS.lease_ms,
    metrics_port: MetricsPort = None,
    metrics_host: MetricsHost = DEFAULT_HOST,
    metrics_stuck_for: Annotated[
        int,
        typer.Option(
            parser=duration_option,
            metavar="DURATION",
            help="redsaga_sagas_stuck counts sagas that have not moved for this long (10m, 2h).",
        ),
    ] = DEFAULT_STUCK_FOR_MS,
    partitions: Annotated[
        str | None,
        typer.Option(
            metavar="INDEXES",
            help="Serve only these partitions of each context (0-3,7); several workers divide a "
            "context's partitions so (default: every partition).",
            show_default=False,
        ),
    ] = None,
    log_level: LogLevel = "info",
    console_logs: ConsoleLogs = False,
) -> None:
    """Run the orchestrators, timers and participant handlers an App declares.

    Registers the App's definition shapes first, and refuses to start (exit code 1, one
    line per problem) when the code changed a registered version incompatibly while sagas
    are in flight on it. Stops gracefully on SIGTERM or SIGINT: reading stops, in-flight
    handlers finish, the rest stays pending for another worker. Logs go to stderr; a Redis
    outage is logged and waited out.

    Every entry is signed and checked with the keyring REDSAGA_KEYRING names (one file per
    process, from `saga keys issue`; REDSAGA_VERIFY=log reports instead of refusing while
    signing is rolled out). Without a keyring the worker refuses to start unless
    REDSAGA_VERIFY=off says to run unauthenticated.

    With --metrics-port the worker serves Prometheus metrics on /metrics, /healthz (the
    process runs) and /readyz (Redis answers, the epoch is the one it joined, its consumer
    groups exist); `saga health ready` asks /readyz (docs/operations.md lists the metrics).
    """
    served = partitions_option(partitions)
    url = real_redis_url(redis_url)
    configure(json_logs=not console_logs, level=log_level)
    app = load_app(app_ref)
    auth = bus.Authenticator.from_env()
    config = EngineConfig(
        bus=bus.BusConfig(concurrency=concurrency, lease_ms=lease_ms),
        auth=auth,
        partitions=served,
    )
    try:
        config.check_partitions(app.contexts)
    except PartitionOutOfRange as error:
        raise typer.BadParameter(str(error), param_hint="'--partitions'") from None
    try:
        auth.refuse_unsigned("this worker")
    except bus.AuthError as error:
        raise CommandError(str(error)) from None
    tune_gc()  # the App is loaded: freeze that heap, collect the young generation less often

    async def main() -> None:
        redis = bus.connect(url)
        try:
            saga_worker = SagaWorker(redis, app, config=config)
            async with anyio.create_task_group() as tasks:
                if metrics_port is not None:  # open first: /healthz answers while it registers
                    metrics = WorkerMetrics(saga_worker, stuck_for_ms=metrics_stuck_for)
                    await open_port(tasks, metrics.server(host=metrics_host, port=metrics_port))
                # A refusal (an incompatible change to a version with sagas in flight) is reported
                # as one error before anything runs; run() registers again, which is idempotent.
                await saga_worker.register()
                await bus.serve(saga_worker)  # SIGTERM/SIGINT drain it; a second signal stops at once
                tasks.cancel_scope.cancel()
        finally:
            await redis.aclose()

    run(main)


def demo(
    redis_url: DemoRedisUrl = None,
    orders: Annotated[int, typer.Option(min=1, max=100_000, help="How many orders to run.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the order generator (same seed, same orders).")] = 7,
    db_dsn: Annotated[
        str | None,
        typer.Option(
            "--db-dsn",
            envvar="REDSAGA_PG_DSN",
            help="PostgreSQL DSN for the payments and inventory databases (default: SQLite files "
            "in a temporary directory).",
            show_default=False,
        ),
    ] = None,
    json_output: Json = False,
) -> None:
    """Run the example order-fulfilment system with injected failures and print the outcomes.

    Orders go through inventory, payments and shipping; payments and inventory keep their
    state in a database and reply through the transactional outbox and its relay. Uses an
    embedded in-memory Redis unless --redis-url (or REDSAGA_REDIS_URL) is given; a Redis
    that does not answer is an error before anything starts. On a terminal, a progress line
    on stderr counts the sagas per status.
    """
    configure(json_logs=True, level="error")
    from redsaga.examples.demo import run_demo  # noqa: PLC0415 - the example loads only for the demo

    embedded = bus.resolve_url(redis_url).startswith(bus.MEMORY_URL)
    progress = None if json_output or not sys.stderr.isatty() else _show_progress

    async def main() -> DemoReport:
        redis = bus.connect(redis_url)
        try:
            with redis_errors():
                await redis.ping()  # an unreachable Redis is an error, not a silent wait
            return await run_demo(redis, orders=orders, seed=seed, db_dsn=db_dsn, progress=progress)
        finally:
            await redis.aclose()

    report = run(main)
    if progress is not None:
        typer.echo("", err=True)  # end the progress line
    if json_output:
        emit_json(report)
        return
    _show_report(report, "an embedded in-memory Redis" if embedded else "Redis")
    if report.unfinished:
        raise typer.Exit(1)


def _show_progress(counts: dict[str, int]) -> None:
    line = "  ".join(f"{status} {n}" for status, n in sorted(counts.items()) if n)
    typer.echo(f"\r{printable(line)}".ljust(80), nl=False, err=True)  # \r: redraw the same line


_LEGEND = (
    ("outcome", "how the sagas ended: completed, or compensated (a declined card or an unserved region"),
    ("", "undid the steps already done: the card refunded, the stock released)"),
    ("sagas", "how many ended so"),
    ("retries", "step attempts beyond the first (the injected flaky services), all absorbed"),
    ("p50 ms", "median time from start to end; p99 ms: the 99th percentile (real time: the hours"),
    ("", "the demo skipped to make an approval overdue are left out)"),
)


def _show_report(report: DemoReport, where: str) -> None:
    emit_line(f"{report.orders} orders in {report.seconds}s on {where}", bold=True)
    emit_line()
    emit_table(
        ["outcome", "sagas", "retries", "p50 ms", "p99 ms"],
        [[o.status, o.sagas, o.retries, o.p50_ms, o.p99_ms] for o in report.outcomes],
        colours={0: status_colour},
    )
    emit_line()
    for name, meaning in _LEGEND:
        emit_line(meaning, prefix=f"{name:<9}")
    emit_line()
    emit_line(
        f"ledger balanced: {cell(report.ledger_balanced)}  (each completed order charged once, "
        "the others nothing in the end)",
        fg=None if report.ledger_balanced else typer.colors.RED,
    )
    emit_line(
        f"stock released: {cell(report.stock_released)}  (no stock held for an order that did not complete)",
        fg=None if report.stock_released else typer.colors.RED,
    )
    _show_approvals(report)
    if report.unfinished:
        emit_line(f"{report.unfinished} sagas did not finish in time", fg=typer.colors.RED)


def _show_approvals(report: DemoReport) -> None:
    from redsaga.examples.orders import APPROVAL_DUE, APPROVAL_LIMIT_CENTS  # noqa: PLC0415 - as run_demo

    if not report.approvals:
        return
    on_time = [a for a in report.approvals if not a.escalated]
    by = ", ".join(sorted({a.approved_by for a in on_time})) or "-"
    emit_line(
        f"approvals: {len(report.approvals)} orders over {APPROVAL_LIMIT_CENTS / 100:.2f} waited for a "
        f"manager; {len(on_time)} approved on time by {by}"
    )
    hours = APPROVAL_DUE.total_seconds() / 3600
    for late in (a for a in report.approvals if a.escalated):
        emit_line(
            f"  {late.order}: left {hours:g} h (the demo's clock skipped ahead), escalated to "
            f"senior-managers, approved by {late.approved_by or '-'}: {'; '.join(late.actions)}"
        )
