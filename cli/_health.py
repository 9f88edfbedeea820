"""``saga health ready|worker|relay``: container health checks.

- **ready**: a worker started with ``--metrics-port`` answers ``/readyz`` on that port with
  200 (connected to Redis, epoch verified, its consumer groups present); anything else, or
  nothing answering, is unhealthy (``bus/_metrics.py``).

- **worker**: its health file. A worker started with ``$REDSAGA_HEALTH_FILE`` (or
  ``EngineConfig.health_file``) rewrites that file every ``heartbeat_ms`` (10 s) from its
  event loop, each time after its Redis answered a ``PING`` (``saga/runtime/liveness.py``). Healthy
  while the file is younger than ``--max-age``: the file goes stale when the loop is stuck
  and when Redis stops answering, and does not exist before the worker reads its streams.
- **relay**: the outbox. Healthy when no committed row has waited longer than
  ``--max-age`` seconds to be published, which fails whether the relay hangs, lost Redis
  or lost its database; an empty outbox is healthy.

Exit codes: 0 healthy, 1 unhealthy (one line on stderr saying why), 2 bad usage.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from typing import Annotated

import msgspec
import typer

import relay
from redsaga.cli._common import CommandError, Json, UsageProblem, emit_json, reporting_errors, run
from redsaga.cli._port import METRICS_PORT_ENV
from redsaga.cli._relay import Dsn, Prefix
from saga.runtime.liveness import HEALTH_FILE_ENV, health_file_age_ms

DEFAULT_MAX_AGE_S = 30.0
"""Three renewals at the default ``EngineConfig.heartbeat_ms`` (10 s)."""

health_app = typer.Typer(
    help="Health checks for containers: exit 0 healthy, 1 unhealthy (the reason on stderr), 2 bad usage.",
    no_args_is_help=True,
)

HealthFile = Annotated[
    str | None,
    typer.Option(
        "--file",
        envvar=HEALTH_FILE_ENV,
        help=f"The worker's health file (env {HEALTH_FILE_ENV}, as the worker was given it).",
        show_default=False,
    ),
]


class WorkerHealth(msgspec.Struct, kw_only=True):
    """The worker check's findings (``saga health worker --json``).

    Attributes:
        healthy: Whether the worker renewed its health file within ``max_age_s``.
        file: The health file.
        age_ms: How long ago the worker renewed it (``None``: there is no such file).
        max_age_s: The oldest renewal allowed.
        problems: Why it is unhealthy (empty when healthy).

    """

    healthy: bool
    file: str
    age_ms: int | None
    max_age_s: float
    problems: list[str]


class ReadyHealth(msgspec.Struct, kw_only=True):
    """The readiness check's findings (``saga health ready --json``).

    Attributes:
        healthy: Whether ``/readyz`` answered 200.
        url: What was asked.
        status: The HTTP status it answered (``None``: nothing answered).
        problems: Why it is unhealthy (empty when healthy): the worker's own reasons.

    """

    healthy: bool
    url: str
    status: int | None
    problems: list[str]


class RelayHealth(msgspec.Struct, kw_only=True):
    """The relay check's findings (``saga health relay --json``).

    Attributes:
        healthy: Whether no committed row waited longer than ``max_age_s``.
        backlog: Rows committed and not yet sent.
        oldest_unsent_age_ms: How long the oldest of them has waited (``None``: none).
        failed: Rows that could not be published (reported, not judged: see ``saga relay failed``).
        max_age_s: The longest wait allowed.
        problems: Why it is unhealthy (empty when healthy).

    """

    healthy: bool
    backlog: int
    oldest_unsent_age_ms: int | None
    failed: int
    max_age_s: float
    problems: list[str]


def check_worker(path: str, *, now_ms: int, max_age_s: float) -> WorkerHealth:
    """Judge a worker by the age of its health file (module docstring)."""
    age = health_file_age_ms(path, now_ms)
    problems = []
    if age is None:
        problems.append(
            f"no health file at {path}: the worker has not started reading its streams "
            f"(or it was not given {HEALTH_FILE_ENV}={path})"
        )
    elif age > max_age_s * 1000:
        problems.append(
            f"the worker last renewed {path} {age / 1000:.1f}s ago (over --max-age {max_age_s:g}s): "
            "its event loop is stuck or its Redis does not answer"
        )
    return WorkerHealth(healthy=not problems, file=path, age_ms=age, max_age_s=max_age_s, problems=problems)


def check_relay(stats: relay.OutboxStats, *, max_age_s: float) -> RelayHealth:
    """Judge a relay by its outbox's figures (module docstring)."""
    age = stats.oldest_unsent_age_ms
    problems = []
    if age is not None and age > max_age_s * 1000:
        problems.append(
            f"the oldest of {stats.backlog} unsent outbox row(s) has waited {age / 1000:.1f}s "
            f"(over --max-age {max_age_s:g}s): the relay is not publishing"
        )
    return RelayHealth(
        healthy=not problems,
        backlog=stats.backlog,
        oldest_unsent_age_ms=age,
        failed=stats.failed,
        max_age_s=max_age_s,
        problems=problems,
    )


def check_ready(url: str, *, timeout_s: float) -> ReadyHealth:
    """Ask a worker's ``/readyz`` (module docstring)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - http only
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return ReadyHealth(
            healthy=False, url=url, status=None, problems=[f"nothing answers at {url}: {reason}"]
        )
    problems = [] if status == 200 else body.decode("utf-8", "replace").splitlines() or [f"HTTP {status}"]
    return ReadyHealth(healthy=not problems, url=url, status=status, problems=problems)


@health_app.command("ready")
@reporting_errors
def ready_command(
    port: Annotated[
        int | None,
        typer.Option(
            envvar=METRICS_PORT_ENV,
            min=1,
            max=65535,
            help=f"The worker's --metrics-port (env {METRICS_PORT_ENV}).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Where the worker listens.")] = "127.0.0.1",
    timeout: Annotated[float, typer.Option(min=0.001, help="Seconds to wait for the answer.")] = 5.0,
    json: Json = False,
) -> None:
    """Check that the worker serving /readyz on --port is ready: Redis answers, epoch, groups.

    Run it where the worker runs (a container's health check). Exit 0 ready, 1 not ready or
    nothing answering (the worker's reasons on stderr), 2 bad usage. --json prints healthy,
    url, status, problems.
    """
    if port is None:
        raise UsageProblem(f"no port given: pass --port (or set {METRICS_PORT_ENV})")
    bracketed = f"[{host}]" if ":" in host else host
    found = check_ready(f"http://{bracketed}:{port}/readyz", timeout_s=timeout)
    _report(found, found.problems, f"ready: {found.url} answered {found.status}", json=json)


@health_app.command("worker")
@reporting_errors
def worker_command(
    file: HealthFile = None,
    max_age: Annotated[
        float,
        typer.Option(
            min=0.001, help="Seconds since the worker last renewed its file (3 renewals by default)."
        ),
    ] = DEFAULT_MAX_AGE_S,
    json: Json = False,
) -> None:
    """Check that the worker running here renews its health file: its loop runs and Redis answers.

    Start the worker with REDSAGA_HEALTH_FILE=PATH and run this where it runs (a container's
    health check) with the same variable. Healthy while the file is younger than --max-age.
    Exit 0 healthy, 1 unhealthy, 2 bad usage. --json prints healthy, file, age_ms,
    max_age_s, problems.
    """
    if not file:
        raise CommandError(f"no health file given: pass --file (or set {HEALTH_FILE_ENV})")
    found = check_worker(file, now_ms=time.time_ns() // 1_000_000, max_age_s=max_age)
    _report(found, found.problems, f"healthy: {file} renewed {found.age_ms} ms ago", json=json)


@health_app.command("relay")
@reporting_errors
def relay_command(
    dsn: Dsn = None,
    tables: Prefix = None,
    max_age: Annotated[
        float, typer.Option(min=0.001, help="Seconds a committed row may wait to be published.")
    ] = 30.0,
    json: Json = False,
) -> None:
    """Check that the relay of an outbox publishes: no committed row waits longer than --max-age.

    Fails whether the relay hangs, cannot reach Redis or its database; an empty outbox is
    healthy, and rows the relay marked failed are reported but do not make it unhealthy.
    Exit 0 healthy, 1 unhealthy or the database unreachable, 2 bad usage. --json prints
    healthy, backlog, oldest_unsent_age_ms, failed, max_age_s, problems.
    """
    if not dsn:
        raise CommandError("no database given: pass --dsn (or set REDSAGA_RELAY_DSN)")
    chosen = tables or relay.Tables()

    async def job() -> relay.OutboxStats:
        try:
            return await relay.outbox_stats(dsn, tables=chosen)
        except relay.RelayError as error:
            raise CommandError(str(error)) from error

    found = check_relay(run(job), max_age_s=max_age)
    _report(
        found, found.problems, f"healthy: {found.backlog} row(s) unsent, none waiting too long", json=json
    )


def _report(
    found: WorkerHealth | RelayHealth | ReadyHealth, problems: list[str], healthy_line: str, *, json: bool
) -> None:
    if json:
        emit_json(found)
    elif not problems:
        typer.echo(healthy_line)
    if problems:
        typer.secho(f"unhealthy: {'; '.join(problems)}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
