"""The metrics port of ``saga worker`` and ``saga relay``: its options, and opening it."""

from __future__ import annotations

from typing import Annotated, Final

import anyio.abc
import typer

from bus.metrics import MetricsServer
from redsaga.cli._common import CommandError

METRICS_PORT_ENV: Final = "REDSAGA_METRICS_PORT"
"""Where ``saga worker`` and ``saga relay`` serve their metrics and health (``--metrics-port``)."""

MetricsPort = Annotated[
    int | None,
    typer.Option(
        envvar=METRICS_PORT_ENV,
        min=0,
        max=65535,
        help="Serve /metrics (Prometheus), /healthz and /readyz on this port "
        f"(env {METRICS_PORT_ENV}; default: no port).",
        show_default=False,
    ),
]
MetricsHost = Annotated[
    str,
    typer.Option(
        envvar="REDSAGA_METRICS_HOST", help="The address the metrics port binds (0.0.0.0: every one)."
    ),
]


async def open_port(tasks: anyio.abc.TaskGroup, server: MetricsServer) -> None:
    """Serve ``server`` in ``tasks`` once it listens; a port it cannot bind is one error line."""
    try:
        await tasks.start(server.serve)
    except OSError as error:
        raise CommandError(
            f"cannot serve metrics on {server.host}:{server.port}: {error.strerror}"
        ) from error
