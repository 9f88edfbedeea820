"""``saga ui``: serve the read-only web UI until stopped."""

from __future__ import annotations

from typing import Annotated

import typer

import bus
from bus.lowlevel import redis_errors
from redsaga.cli._common import CommandError, RedisUrl, emit_line, real_redis_url, run
from redsaga.cli._logging import LogLevel

UI_EXTRA = "pip install 'redsaga[ui]'"


def ui(
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="The port to serve on (0: a free one).")
    ] = 8080,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="The address to listen on. The default answers only this machine; anything else "
            "shows every saga's data to whoever reaches it (the UI has no login).",
        ),
    ] = "127.0.0.1",
    redis_url: RedisUrl = None,
    log_level: LogLevel = "warning",
) -> None:
    """Serve the read-only web UI: sagas, a saga's path over its diagram, dead letters, stats.

    Pages: / (the sagas, by status, definition, version or time stuck), /sagas/ID (timeline,
    attempts with input and output, timers and waits, compensations in order, the diagram
    with the path taken), /dead-letters and /stats. Reads only what is in Redis: no --app,
    and it changes nothing (operator actions stay in this command line). Prints the URL on
    stderr and serves until SIGINT or SIGTERM. No --json: it serves pages, it prints no data.
    Exit code 1 when Redis does not answer or the port cannot be bound, 2 for bad usage.
    """
    url = real_redis_url(redis_url)
    try:
        from saga.ops.ui import allowed_hosts, create_app, listen, ui_server  # noqa: PLC0415 - only this command needs the extra
    except ImportError as error:
        raise CommandError(
            f"saga ui needs the ui extra ({error.name} is not installed): {UI_EXTRA}"
        ) from None
    try:
        sock = listen(host, port)
    except OSError as error:
        raise CommandError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None

    async def main() -> None:
        redis = bus.connect(url)
        try:
            with redis_errors():
                await redis.ping()  # Redis down is an error now, not a page later
            app = create_app(redis, allowed_hosts=allowed_hosts(host))
            bound = sock.getsockname()
            where = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            emit_line(f"redsaga UI on http://{where}:{bound[1]}/ (read-only; Ctrl-C stops it)", err=True)
            await ui_server(app, log_level=log_level).serve([sock])
        finally:
            sock.close()
            await redis.aclose()

    run(main)
