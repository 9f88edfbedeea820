"""``saga worker`` and ``saga demo``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

import bus
from cli._common import Json, RedisUrl, emit_json, emit_table, run
from cli._load import load_object
from cli._logging import configure
from saga import App, EngineConfig, SagaWorker, tune_gc

if TYPE_CHECKING:
    from services_example.demo import DemoReport

_DEFAULTS = bus.BusConfig()


def worker(
    app_ref: Annotated[str, typer.Option("--app", help="The App to run, as module:attribute.")],
    redis_url: RedisUrl = None,
    concurrency: Annotated[
        int, typer.Option(help="Handler slots (entries handled at once).")
    ] = _DEFAULTS.concurrency,
    lease_ms: Annotated[
        int, typer.Option(help="Lease on an entry; a silent worker loses it after this.")
    ] = _DEFAULTS.lease_ms,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    console_logs: Annotated[bool, typer.Option(help="Readable logs instead of JSON lines.")] = False,
) -> None:
    """Run the orchestrators, timers and participant handlers an App declares.

    Registers the App's definition shapes first, and refuses to start (exit code 1, one
    line per problem) when the code changed a registered version incompatibly while sagas
    are in flight on it. Stops gracefully on SIGTERM or SIGINT: reading stops, in-flight
    handlers finish, the rest stays pending for another worker.
    """
    configure(json_logs=not console_logs, level=log_level)
    app = load_object(app_ref)
    if not isinstance(app, App):
        raise typer.BadParameter(f"{app_ref} is a {type(app).__name__}, not a saga.App", param_hint="--app")
    config = EngineConfig(bus=bus.BusConfig(concurrency=concurrency, lease_ms=lease_ms))
    tune_gc()  # the App is loaded: freeze that heap, collect the young generation less often

    async def main() -> None:
        redis = bus.connect(redis_url)
        try:
            saga_worker = SagaWorker(redis, app, config=config)
            # A refusal (an incompatible change to a version with sagas in flight) is reported
            # as one error before anything runs; run() registers again, which is idempotent.
            await saga_worker.register()
            await bus.serve(saga_worker)  # SIGTERM/SIGINT drain it; a second signal stops at once
        finally:
            await redis.aclose()

    run(main)


def demo(
    redis_url: RedisUrl = None,
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
    embedded in-memory Redis unless --redis-url (or REDSAGA_REDIS_URL) is given.
    """
    configure(json_logs=True, level="error")
    from services_example.demo import run_demo  # noqa: PLC0415 - the example loads only for the demo

    def show(counts: dict[str, int]) -> None:
        if not json_output:
            line = "  ".join(f"{status} {n}" for status, n in sorted(counts.items()) if n)
            typer.echo(f"\r{line}".ljust(80), nl=False, err=True)

    async def main() -> DemoReport:
        redis = bus.connect(redis_url)
        try:
            return await run_demo(redis, orders=orders, seed=seed, db_dsn=db_dsn, progress=show)
        finally:
            await redis.aclose()

    report = run(main)
    if json_output:
        emit_json(report)
        return
    typer.echo("", err=True)
    where = (
        "embedded in-memory Redis" if not (redis_url or bus.resolve_url(None) != bus.MEMORY_URL) else "Redis"
    )
    typer.echo(f"{report.orders} orders in {report.seconds}s on {where}")
    emit_table(
        ["outcome", "sagas", "retries", "p50 ms", "p99 ms"],
        [[o.status, o.sagas, o.retries, o.p50_ms, o.p99_ms] for o in report.outcomes],
    )
    typer.echo(f"ledger balanced: {report.ledger_balanced}   stock released: {report.stock_released}")
    if report.unfinished:
        typer.secho(f"{report.unfinished} sagas did not finish in time", fg=typer.colors.RED)
        raise typer.Exit(1)
